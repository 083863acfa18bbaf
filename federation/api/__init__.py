"""The wire: the gRPC servicers (jobs, federation, administration, finance reports, capacity plans,
datasets, logs and describe), open streams re-checked on revocation, redaction of what a caller may
not read, protobuf conversion, the one error-to-status map, the generated stubs (`v1/`) and the
Python clients the CLI and tests use.

Below `runtime` (which serves it) and `cli` (which calls it); it imports the rooms it exposes.
"""
