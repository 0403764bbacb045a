"""Who is calling, and what they may do (DESIGN §13).

One `Authenticator` per server, chosen by `serve --auth`, turns a call into an
`Identity` (owner, worker or admin); the API layer's call gate enforces the role
each service needs, once, before any servicer runs.
"""
