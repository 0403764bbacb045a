"""`leasehold.testing`: running a handler without a server."""
