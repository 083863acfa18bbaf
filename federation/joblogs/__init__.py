"""Job logs that outlive pods: the kept tails of ended attempts in etcd, the `logs:` settings,
failure reasons from pod states, and merging replicas' live log streams into one.
"""
