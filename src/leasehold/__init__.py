"""Leasehold: durable job scheduling over gRPC.

The public Python API lives here: `leasehold.worker` (the handler API),
`leasehold.testing` (run a handler without a server, or a real server as a
child process), `leasehold.examples` (the built-in example kinds) and
`leasehold.v1` (the generated protobuf stubs).
`leasehold._server` is the service's private implementation: nothing in it is
promised to stay where it is.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("leasehold")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
