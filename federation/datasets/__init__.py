"""Datasets in the federation: the registry in etcd, object-store records, sync records, the
submission check of `spec.dataset`, and STAGING (the dispatcher's gate and the leader's syncs).
"""
