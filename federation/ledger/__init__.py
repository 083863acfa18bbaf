"""Reads of the usage ledger: its cache, GPU-hours per tenant for budgets and fair share, and
finance reports (`report/`). The intervals themselves are written by `store.intervals`.
"""
