"""The `gpufed.v1` protocol: `gpufed.proto` and the stubs `make proto` generates from it (never committed)."""
