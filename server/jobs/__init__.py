"""The job domain: records, the state machine's rules and the repository seam.

Nothing here knows about gRPC or any particular database.
"""
