"""Capacity on demand: the capacity reconciler on the leader, its records in etcd, the
`capacity:` config section, which pools may grow, previews of capacity plans.
"""
