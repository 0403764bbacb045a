"""`leasehold worker-conformance`: a worker in any language, judged against a
real server through a proxy that plays the server's tricks on it.

stage.py starts what the rules play on (serve, the worker's process group, an
owner's client), proxy.py sits between the worker and the server, rules.py
holds the rules, and command.py is the subcommand.
"""
