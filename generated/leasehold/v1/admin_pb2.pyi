import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from leasehold.v1 import jobs_pb2 as _jobs_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetQueueStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetQueueStatsResponse(_message.Message):
    __slots__ = ("kinds", "running_by_owner", "finished_per_minute", "oldest_queued_due_at", "oldest_queued_job_id", "computed_at", "truncated")
    KINDS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_BY_OWNER_FIELD_NUMBER: _ClassVar[int]
    FINISHED_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    OLDEST_QUEUED_DUE_AT_FIELD_NUMBER: _ClassVar[int]
    OLDEST_QUEUED_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_AT_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    kinds: _containers.RepeatedCompositeFieldContainer[KindStats]
    running_by_owner: _containers.RepeatedCompositeFieldContainer[OwnerRunning]
    finished_per_minute: _containers.RepeatedCompositeFieldContainer[MinuteThroughput]
    oldest_queued_due_at: _timestamp_pb2.Timestamp
    oldest_queued_job_id: str
    computed_at: _timestamp_pb2.Timestamp
    truncated: bool
    def __init__(self, kinds: _Optional[_Iterable[_Union[KindStats, _Mapping]]] = ..., running_by_owner: _Optional[_Iterable[_Union[OwnerRunning, _Mapping]]] = ..., finished_per_minute: _Optional[_Iterable[_Union[MinuteThroughput, _Mapping]]] = ..., oldest_queued_due_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., oldest_queued_job_id: _Optional[str] = ..., computed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class KindStats(_message.Message):
    __slots__ = ("kind", "queued", "running", "succeeded_last_hour", "failed_last_hour", "cancelled_last_hour", "oldest_queued_due_at", "paused")
    KIND_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_LAST_HOUR_FIELD_NUMBER: _ClassVar[int]
    FAILED_LAST_HOUR_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_LAST_HOUR_FIELD_NUMBER: _ClassVar[int]
    OLDEST_QUEUED_DUE_AT_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    kind: str
    queued: int
    running: int
    succeeded_last_hour: int
    failed_last_hour: int
    cancelled_last_hour: int
    oldest_queued_due_at: _timestamp_pb2.Timestamp
    paused: bool
    def __init__(self, kind: _Optional[str] = ..., queued: _Optional[int] = ..., running: _Optional[int] = ..., succeeded_last_hour: _Optional[int] = ..., failed_last_hour: _Optional[int] = ..., cancelled_last_hour: _Optional[int] = ..., oldest_queued_due_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., paused: _Optional[bool] = ...) -> None: ...

class OwnerRunning(_message.Message):
    __slots__ = ("owner_id", "running")
    OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    owner_id: str
    running: int
    def __init__(self, owner_id: _Optional[str] = ..., running: _Optional[int] = ...) -> None: ...

class MinuteThroughput(_message.Message):
    __slots__ = ("minute", "succeeded", "failed", "cancelled")
    MINUTE_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    minute: _timestamp_pb2.Timestamp
    succeeded: int
    failed: int
    cancelled: int
    def __init__(self, minute: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., succeeded: _Optional[int] = ..., failed: _Optional[int] = ..., cancelled: _Optional[int] = ...) -> None: ...

class JobFilter(_message.Message):
    __slots__ = ("statuses", "kind", "owner_id", "resource_type", "resource_id")
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedScalarFieldContainer[_jobs_pb2.JobStatus]
    kind: str
    owner_id: str
    resource_type: str
    resource_id: str
    def __init__(self, statuses: _Optional[_Iterable[_Union[_jobs_pb2.JobStatus, str]]] = ..., kind: _Optional[str] = ..., owner_id: _Optional[str] = ..., resource_type: _Optional[str] = ..., resource_id: _Optional[str] = ...) -> None: ...

class ListAllJobsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "filter")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    filter: JobFilter
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., filter: _Optional[_Union[JobFilter, _Mapping]] = ...) -> None: ...

class ListAllJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_jobs_pb2.Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[_jobs_pb2.Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class BulkCancelRequest(_message.Message):
    __slots__ = ("filter", "dry_run", "confirm_all")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_ALL_FIELD_NUMBER: _ClassVar[int]
    filter: JobFilter
    dry_run: bool
    confirm_all: bool
    def __init__(self, filter: _Optional[_Union[JobFilter, _Mapping]] = ..., dry_run: _Optional[bool] = ..., confirm_all: _Optional[bool] = ...) -> None: ...

class BulkCancelResponse(_message.Message):
    __slots__ = ("matched", "dry_run")
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    matched: int
    dry_run: bool
    def __init__(self, matched: _Optional[int] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class BulkRetryRequest(_message.Message):
    __slots__ = ("filter", "dry_run", "confirm_all")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_ALL_FIELD_NUMBER: _ClassVar[int]
    filter: JobFilter
    dry_run: bool
    confirm_all: bool
    def __init__(self, filter: _Optional[_Union[JobFilter, _Mapping]] = ..., dry_run: _Optional[bool] = ..., confirm_all: _Optional[bool] = ...) -> None: ...

class BulkRetryResponse(_message.Message):
    __slots__ = ("matched", "dry_run")
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    matched: int
    dry_run: bool
    def __init__(self, matched: _Optional[int] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class PauseKindRequest(_message.Message):
    __slots__ = ("kind",)
    KIND_FIELD_NUMBER: _ClassVar[int]
    kind: str
    def __init__(self, kind: _Optional[str] = ...) -> None: ...

class PauseKindResponse(_message.Message):
    __slots__ = ("kind", "paused")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    kind: str
    paused: bool
    def __init__(self, kind: _Optional[str] = ..., paused: _Optional[bool] = ...) -> None: ...

class ResumeKindRequest(_message.Message):
    __slots__ = ("kind",)
    KIND_FIELD_NUMBER: _ClassVar[int]
    kind: str
    def __init__(self, kind: _Optional[str] = ...) -> None: ...

class ResumeKindResponse(_message.Message):
    __slots__ = ("kind", "paused")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    kind: str
    paused: bool
    def __init__(self, kind: _Optional[str] = ..., paused: _Optional[bool] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers", "truncated")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[RemoteWorker]
    truncated: bool
    def __init__(self, workers: _Optional[_Iterable[_Union[RemoteWorker, _Mapping]]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class RemoteWorker(_message.Message):
    __slots__ = ("worker_id", "kinds", "jobs_held", "last_seen_at", "claiming")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    JOBS_HELD_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_AT_FIELD_NUMBER: _ClassVar[int]
    CLAIMING_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    kinds: _containers.RepeatedScalarFieldContainer[str]
    jobs_held: int
    last_seen_at: _timestamp_pb2.Timestamp
    claiming: bool
    def __init__(self, worker_id: _Optional[str] = ..., kinds: _Optional[_Iterable[str]] = ..., jobs_held: _Optional[int] = ..., last_seen_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., claiming: _Optional[bool] = ...) -> None: ...
