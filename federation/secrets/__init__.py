"""Tenants' secrets: sealed at rest with a key that is not in etcd, copied to a member cluster only
for the life of a job that references them (issue 32; docs/jobs.md, "Secrets")."""
