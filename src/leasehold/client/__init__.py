"""The Python client of Leasehold: `Client` for JobService and ScheduleService,
`AdminClient` (through `Client.admin`) for AdminService.

It needs only grpcio, protobuf and the stubs in `leasehold.v1`, so it installs on
its own (the `leasehold-client` distribution) without the server's database stack.
Calls return the generated proto messages; errors are `grpc.aio.AioRpcError`.
"""

from leasehold.client._admin import AdminClient
from leasehold.client._client import Client
from leasehold.client._connection import Tls
from leasehold.client._retry import RetryOptions

__all__ = ["AdminClient", "Client", "RetryOptions", "Tls"]
