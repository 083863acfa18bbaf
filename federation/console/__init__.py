"""The web console: server-rendered pages over the same servicers as the gRPC API.

A room between `runtime` (which serves it on the HTTP port beside `/metrics`) and `api` (whose
servicers it calls in process, with the signed-in user's token): authentication, tenant isolation,
redaction, read limits and the audit trail are the API's own, not a copy. See `docs/console.md`.
"""
