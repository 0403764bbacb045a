"""The job domain: records, limits, the state machine and the repository seam.

Nothing here knows about gRPC or any particular database.
"""
