"""The Python client of Leasehold: `Client` for JobService and ScheduleService,
`AdminClient` (through `Client.admin`) for AdminService.

It needs only grpcio, protobuf and the stubs in `leasehold.v1`, so it installs on
its own (the `leasehold-client` distribution) without the server's database stack.
Calls return the generated proto messages; errors are `grpc.aio.AioRpcError`.
`to_dict` turns one (or a job's `result`, an event's `payload`) into Python values,
integral numbers as `int` where a `Struct` would give `1024.0`.
"""

from leasehold.client._admin import AdminClient
from leasehold.client._client import Client
from leasehold.client._connection import Tls
from leasehold.client._convert import enqueue_request
from leasehold.client._json import to_dict
from leasehold.client._retry import RetryOptions

__all__ = ["AdminClient", "Client", "RetryOptions", "Tls", "enqueue_request", "to_dict"]
