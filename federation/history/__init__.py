"""The history store: finished jobs, their ledger intervals and the audit trail, kept in SQL.

etcd holds what the federation is doing now; this room holds what it has done, for as long as
finance and auditors need it, in a database built for that (SQLite embedded by default, PostgreSQL
in production). It sits between `store` (whose records it keeps: `JobRecord`, `LedgerInterval`) and
the rooms that read history (`ledger` for reports, `security` for the audit trail, `scheduling` for
the archiver), so it imports only `store`, `spec` and `placement`. Audit records arrive as this
room's own `ArchivedAudit`, because `security` sits above it.

The archiver that moves ended jobs and old audit records here from etcd is
`federation.scheduling.archiver`, on the leader; the read paths that span both stores are in `api`.
"""
