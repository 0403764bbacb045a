"""Baselines: what the same measurement gives without Leasehold (no-op gRPC, raw sqlite3, huey)."""
