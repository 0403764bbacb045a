import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATUS_UNSPECIFIED: _ClassVar[JobStatus]
    JOB_STATUS_QUEUED: _ClassVar[JobStatus]
    JOB_STATUS_RUNNING: _ClassVar[JobStatus]
    JOB_STATUS_SUCCEEDED: _ClassVar[JobStatus]
    JOB_STATUS_FAILED: _ClassVar[JobStatus]
    JOB_STATUS_CANCELLED: _ClassVar[JobStatus]

class ParentFailurePolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PARENT_FAILURE_POLICY_UNSPECIFIED: _ClassVar[ParentFailurePolicy]
    PARENT_FAILURE_POLICY_CANCEL: _ClassVar[ParentFailurePolicy]
    PARENT_FAILURE_POLICY_RUN: _ClassVar[ParentFailurePolicy]

class WaitReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WAIT_REASON_UNSPECIFIED: _ClassVar[WaitReason]
    WAIT_REASON_SCHEDULED: _ClassVar[WaitReason]
    WAIT_REASON_BACKOFF: _ClassVar[WaitReason]
    WAIT_REASON_KIND_LIMIT: _ClassVar[WaitReason]
    WAIT_REASON_OWNER_LIMIT: _ClassVar[WaitReason]
    WAIT_REASON_RATE_LIMIT: _ClassVar[WaitReason]
    WAIT_REASON_PAUSED: _ClassVar[WaitReason]
    WAIT_REASON_NO_WORKER: _ClassVar[WaitReason]
    WAIT_REASON_READY: _ClassVar[WaitReason]
    WAIT_REASON_DEPENDENCIES: _ClassVar[WaitReason]
JOB_STATUS_UNSPECIFIED: JobStatus
JOB_STATUS_QUEUED: JobStatus
JOB_STATUS_RUNNING: JobStatus
JOB_STATUS_SUCCEEDED: JobStatus
JOB_STATUS_FAILED: JobStatus
JOB_STATUS_CANCELLED: JobStatus
PARENT_FAILURE_POLICY_UNSPECIFIED: ParentFailurePolicy
PARENT_FAILURE_POLICY_CANCEL: ParentFailurePolicy
PARENT_FAILURE_POLICY_RUN: ParentFailurePolicy
WAIT_REASON_UNSPECIFIED: WaitReason
WAIT_REASON_SCHEDULED: WaitReason
WAIT_REASON_BACKOFF: WaitReason
WAIT_REASON_KIND_LIMIT: WaitReason
WAIT_REASON_OWNER_LIMIT: WaitReason
WAIT_REASON_RATE_LIMIT: WaitReason
WAIT_REASON_PAUSED: WaitReason
WAIT_REASON_NO_WORKER: WaitReason
WAIT_REASON_READY: WaitReason
WAIT_REASON_DEPENDENCIES: WaitReason

class Job(_message.Message):
    __slots__ = ("id", "kind", "resource_type", "resource_id", "status", "attempt", "max_attempts", "timeout_seconds", "available_at", "cancel_requested_at", "retry_of_job_id", "error_message", "created_at", "updated_at", "started_at", "completed_at", "error_type", "result", "run_at", "priority", "retry_policy", "wait_reason", "owner_id", "depends_on", "pending_dependencies", "on_parent_failure")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_AT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    RETRY_OF_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    RETRY_POLICY_FIELD_NUMBER: _ClassVar[int]
    WAIT_REASON_FIELD_NUMBER: _ClassVar[int]
    OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_FIELD_NUMBER: _ClassVar[int]
    PENDING_DEPENDENCIES_FIELD_NUMBER: _ClassVar[int]
    ON_PARENT_FAILURE_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: str
    resource_type: str
    resource_id: str
    status: JobStatus
    attempt: int
    max_attempts: int
    timeout_seconds: int
    available_at: _timestamp_pb2.Timestamp
    cancel_requested_at: _timestamp_pb2.Timestamp
    retry_of_job_id: str
    error_message: str
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    started_at: _timestamp_pb2.Timestamp
    completed_at: _timestamp_pb2.Timestamp
    error_type: str
    result: _struct_pb2.Struct
    run_at: _timestamp_pb2.Timestamp
    priority: int
    retry_policy: RetryPolicy
    wait_reason: WaitReason
    owner_id: str
    depends_on: _containers.RepeatedScalarFieldContainer[str]
    pending_dependencies: int
    on_parent_failure: ParentFailurePolicy
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[str] = ..., resource_type: _Optional[str] = ..., resource_id: _Optional[str] = ..., status: _Optional[_Union[JobStatus, str]] = ..., attempt: _Optional[int] = ..., max_attempts: _Optional[int] = ..., timeout_seconds: _Optional[int] = ..., available_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cancel_requested_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., retry_of_job_id: _Optional[str] = ..., error_message: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., completed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error_type: _Optional[str] = ..., result: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., run_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., priority: _Optional[int] = ..., retry_policy: _Optional[_Union[RetryPolicy, _Mapping]] = ..., wait_reason: _Optional[_Union[WaitReason, str]] = ..., owner_id: _Optional[str] = ..., depends_on: _Optional[_Iterable[str]] = ..., pending_dependencies: _Optional[int] = ..., on_parent_failure: _Optional[_Union[ParentFailurePolicy, str]] = ...) -> None: ...

class RetryPolicy(_message.Message):
    __slots__ = ("initial_interval_seconds", "backoff_coefficient", "max_interval_seconds", "non_retryable_error_types")
    INITIAL_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_COEFFICIENT_FIELD_NUMBER: _ClassVar[int]
    MAX_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NON_RETRYABLE_ERROR_TYPES_FIELD_NUMBER: _ClassVar[int]
    initial_interval_seconds: float
    backoff_coefficient: float
    max_interval_seconds: float
    non_retryable_error_types: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, initial_interval_seconds: _Optional[float] = ..., backoff_coefficient: _Optional[float] = ..., max_interval_seconds: _Optional[float] = ..., non_retryable_error_types: _Optional[_Iterable[str]] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("job_id", "sequence", "type", "payload", "created_at")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    sequence: int
    type: str
    payload: _struct_pb2.Struct
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, job_id: _Optional[str] = ..., sequence: _Optional[int] = ..., type: _Optional[str] = ..., payload: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class EnqueueRequest(_message.Message):
    __slots__ = ("kind", "resource_type", "resource_id", "payload", "max_attempts", "timeout_seconds", "run_at", "priority", "retry_policy", "request_id", "depends_on", "on_parent_failure", "ref", "depends_on_refs")
    KIND_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    RETRY_POLICY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_FIELD_NUMBER: _ClassVar[int]
    ON_PARENT_FAILURE_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_REFS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    resource_type: str
    resource_id: str
    payload: _struct_pb2.Struct
    max_attempts: int
    timeout_seconds: int
    run_at: _timestamp_pb2.Timestamp
    priority: int
    retry_policy: RetryPolicy
    request_id: str
    depends_on: _containers.RepeatedScalarFieldContainer[str]
    on_parent_failure: ParentFailurePolicy
    ref: str
    depends_on_refs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, kind: _Optional[str] = ..., resource_type: _Optional[str] = ..., resource_id: _Optional[str] = ..., payload: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., max_attempts: _Optional[int] = ..., timeout_seconds: _Optional[int] = ..., run_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., priority: _Optional[int] = ..., retry_policy: _Optional[_Union[RetryPolicy, _Mapping]] = ..., request_id: _Optional[str] = ..., depends_on: _Optional[_Iterable[str]] = ..., on_parent_failure: _Optional[_Union[ParentFailurePolicy, str]] = ..., ref: _Optional[str] = ..., depends_on_refs: _Optional[_Iterable[str]] = ...) -> None: ...

class EnqueueResponse(_message.Message):
    __slots__ = ("job", "created")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    job: Job
    created: bool
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "statuses", "kind", "resource_type", "resource_id", "depends_on")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    statuses: _containers.RepeatedScalarFieldContainer[JobStatus]
    kind: str
    resource_type: str
    resource_id: str
    depends_on: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., statuses: _Optional[_Iterable[_Union[JobStatus, str]]] = ..., kind: _Optional[str] = ..., resource_type: _Optional[str] = ..., resource_id: _Optional[str] = ..., depends_on: _Optional[str] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class RetryRequest(_message.Message):
    __slots__ = ("job_id", "request_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    request_id: str
    def __init__(self, job_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class RetryResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("job_id", "after_sequence")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    after_sequence: int
    def __init__(self, job_id: _Optional[str] = ..., after_sequence: _Optional[int] = ...) -> None: ...

class WatchEventsResponse(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: JobEvent
    def __init__(self, event: _Optional[_Union[JobEvent, _Mapping]] = ...) -> None: ...

class BatchEnqueueRequest(_message.Message):
    __slots__ = ("requests", "request_id")
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[EnqueueRequest]
    request_id: str
    def __init__(self, requests: _Optional[_Iterable[_Union[EnqueueRequest, _Mapping]]] = ..., request_id: _Optional[str] = ...) -> None: ...

class BatchEnqueueResponse(_message.Message):
    __slots__ = ("responses",)
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[EnqueueResponse]
    def __init__(self, responses: _Optional[_Iterable[_Union[EnqueueResponse, _Mapping]]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("total", "kinds", "kinds_truncated", "computed_at")
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    KINDS_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_AT_FIELD_NUMBER: _ClassVar[int]
    total: JobCounts
    kinds: _containers.RepeatedCompositeFieldContainer[KindJobCounts]
    kinds_truncated: bool
    computed_at: _timestamp_pb2.Timestamp
    def __init__(self, total: _Optional[_Union[JobCounts, _Mapping]] = ..., kinds: _Optional[_Iterable[_Union[KindJobCounts, _Mapping]]] = ..., kinds_truncated: _Optional[bool] = ..., computed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class JobCounts(_message.Message):
    __slots__ = ("queued", "running", "succeeded", "failed", "cancelled")
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    queued: int
    running: int
    succeeded: int
    failed: int
    cancelled: int
    def __init__(self, queued: _Optional[int] = ..., running: _Optional[int] = ..., succeeded: _Optional[int] = ..., failed: _Optional[int] = ..., cancelled: _Optional[int] = ...) -> None: ...

class KindJobCounts(_message.Message):
    __slots__ = ("kind", "counts")
    KIND_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    counts: JobCounts
    def __init__(self, kind: _Optional[str] = ..., counts: _Optional[_Union[JobCounts, _Mapping]] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("after_position", "kinds", "resource_type", "event_types", "tail")
    AFTER_POSITION_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPES_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    after_position: str
    kinds: _containers.RepeatedScalarFieldContainer[str]
    resource_type: str
    event_types: _containers.RepeatedScalarFieldContainer[str]
    tail: bool
    def __init__(self, after_position: _Optional[str] = ..., kinds: _Optional[_Iterable[str]] = ..., resource_type: _Optional[str] = ..., event_types: _Optional[_Iterable[str]] = ..., tail: _Optional[bool] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("event", "position", "kind", "resource_type", "resource_id")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    event: JobEvent
    position: str
    kind: str
    resource_type: str
    resource_id: str
    def __init__(self, event: _Optional[_Union[JobEvent, _Mapping]] = ..., position: _Optional[str] = ..., kind: _Optional[str] = ..., resource_type: _Optional[str] = ..., resource_id: _Optional[str] = ...) -> None: ...
