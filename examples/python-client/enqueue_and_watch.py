"""Enqueue a job with leasehold.client, watch its progress, and read its outcome.

    pip install ./clients/python              # the client alone: grpcio + protobuf
    python examples/python-client/enqueue_and_watch.py

LEASEHOLD_SERVER (default 127.0.0.1:50051) says where; LEASEHOLD_TOKEN (serve
--auth token|jwt) or else LEASEHOLD_OWNER (the x-owner-id header, default
"python-example") says who. Exits 0 when the job succeeded, 1 otherwise.
"""

from __future__ import annotations

import asyncio
import os
import sys

from leasehold.client import Client, to_dict
from leasehold.v1 import jobs_pb2


async def main() -> int:
    token = os.environ.get("LEASEHOLD_TOKEN")
    async with Client(
        os.environ.get("LEASEHOLD_SERVER", "127.0.0.1:50051"),
        token=token,
        owner=None if token else os.environ.get("LEASEHOLD_OWNER", "python-example"),
    ) as client:
        # Safe to retry: the client sends a request_id, so a retry after a lost
        # answer returns the same job instead of making a second one.
        enqueued = await client.enqueue("example.sleep", {"seconds": 2, "steps": 4})
        print(f"enqueued {enqueued.job.id}")

        # Replayed from the start, then live; resumes by itself if the stream
        # breaks or the server restarts, and ends after the job's last event.
        async for event in client.watch(enqueued.job.id):
            if event.type == "progress":
                progress = to_dict(event.payload)  # {"step": 1, "steps": 4}: ints, as sent
                print(f"progress {progress['step']}/{progress['steps']}")
            else:
                print(f"{event.sequence} {event.type}")

        job = await client.get(enqueued.job.id)
        print(f"status {jobs_pb2.JobStatus.Name(job.status)}")
        return 0 if job.status == jobs_pb2.JOB_STATUS_SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
