"""What the federation keeps in etcd: the key-value layer (etcd and its in-memory twin, group
commit), job records and their transition table, tenant/user/approval records, the usage
intervals written in a transition's own transaction, the job store and the job cache.

Imports only `spec`.
"""
