"""The plan JSON schema and example exported plans (data only)."""
