"""Wiring: one server from a config (gRPC, HTTP, the leader's tasks), `gpufed serve`, the
embedded default of `gpufed up`, and the processes it owns (etcd, the cluster simulator,
SeaweedFS).
"""
