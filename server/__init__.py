"""Leasehold: durable job scheduling over gRPC."""
