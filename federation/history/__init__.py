"""The history store: finished jobs, their ledger intervals and the audit trail, kept in SQL.

etcd holds what the federation is doing now; this room holds what it has done, for as long as
finance and auditors need it, in a database built for that (SQLite embedded by default, PostgreSQL
in production). It sits between `store` (whose records it keeps: `JobRecord`, `LedgerInterval`) and
the rooms that read history (`ledger` for reports, `security` for the audit trail, `scheduling` for
the archiver), so it imports only `store`, `spec` and `placement`. Audit records arrive as this
room's own `ArchivedAudit`, because `security` sits above it.

Not yet built (next step of issue 19): the archiver that moves ended jobs here from etcd, and the
read paths (`get`, `list --all`, reports, `audit`) that span both stores.
"""
