"""Leasehold's private implementation, installed as `leasehold._server`.

Users import the public package (`leasehold.worker`, `leasehold.testing`,
`leasehold.v1`); nothing here is promised to stay where it is.
"""
