"""Kubernetes API conformance, judged by the real kubectl and the official client.

Written from the Kubernetes API documentation, not from the simulator's code: each case states the
documented behaviour it checks. It runs against `gpufed up`'s simulator (started here as the same
process, `python -m clusters.sim`) in `make test`, and against a real cluster when
`GPUFED_TEST_KUBECONFIG` names one.
"""
