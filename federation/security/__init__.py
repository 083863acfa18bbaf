"""Who may do what: bearer tokens, every tenant-isolation rule, token and audit records,
rate limits.
"""
