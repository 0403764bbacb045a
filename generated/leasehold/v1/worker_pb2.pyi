import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from leasehold.v1 import jobs_pb2 as _jobs_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ClaimRequest(_message.Message):
    __slots__ = ("worker_id", "kinds", "max_jobs", "wait_seconds", "held_leases")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    MAX_JOBS_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HELD_LEASES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    kinds: _containers.RepeatedScalarFieldContainer[str]
    max_jobs: int
    wait_seconds: float
    held_leases: _containers.RepeatedCompositeFieldContainer[LeaseRef]
    def __init__(self, worker_id: _Optional[str] = ..., kinds: _Optional[_Iterable[str]] = ..., max_jobs: _Optional[int] = ..., wait_seconds: _Optional[float] = ..., held_leases: _Optional[_Iterable[_Union[LeaseRef, _Mapping]]] = ...) -> None: ...

class ClaimResponse(_message.Message):
    __slots__ = ("jobs", "held")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[ClaimedJob]
    held: _containers.RepeatedCompositeFieldContainer[LeaseState]
    def __init__(self, jobs: _Optional[_Iterable[_Union[ClaimedJob, _Mapping]]] = ..., held: _Optional[_Iterable[_Union[LeaseState, _Mapping]]] = ...) -> None: ...

class ClaimedJob(_message.Message):
    __slots__ = ("job", "payload", "owner_id", "lease_token", "lease_expires_at", "heartbeat_interval_seconds", "traceparent", "checkpoint", "parent_results")
    class ParentResultsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _struct_pb2.Struct
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...
    JOB_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    PARENT_RESULTS_FIELD_NUMBER: _ClassVar[int]
    job: _jobs_pb2.Job
    payload: _struct_pb2.Struct
    owner_id: str
    lease_token: str
    lease_expires_at: _timestamp_pb2.Timestamp
    heartbeat_interval_seconds: float
    traceparent: str
    checkpoint: _struct_pb2.Struct
    parent_results: _containers.MessageMap[str, _struct_pb2.Struct]
    def __init__(self, job: _Optional[_Union[_jobs_pb2.Job, _Mapping]] = ..., payload: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., owner_id: _Optional[str] = ..., lease_token: _Optional[str] = ..., lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., heartbeat_interval_seconds: _Optional[float] = ..., traceparent: _Optional[str] = ..., checkpoint: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., parent_results: _Optional[_Mapping[str, _struct_pb2.Struct]] = ...) -> None: ...

class LeaseRef(_message.Message):
    __slots__ = ("job_id", "lease_token", "checkpoint")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    lease_token: str
    checkpoint: _struct_pb2.Struct
    def __init__(self, job_id: _Optional[str] = ..., lease_token: _Optional[str] = ..., checkpoint: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("leases",)
    LEASES_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[LeaseRef]
    def __init__(self, leases: _Optional[_Iterable[_Union[LeaseRef, _Mapping]]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("states",)
    STATES_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedCompositeFieldContainer[LeaseState]
    def __init__(self, states: _Optional[_Iterable[_Union[LeaseState, _Mapping]]] = ...) -> None: ...

class LeaseState(_message.Message):
    __slots__ = ("job_id", "lease_expires_at", "cancel_requested", "lost")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    lease_expires_at: _timestamp_pb2.Timestamp
    cancel_requested: bool
    lost: bool
    def __init__(self, job_id: _Optional[str] = ..., lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cancel_requested: _Optional[bool] = ..., lost: _Optional[bool] = ...) -> None: ...

class AppendEventRequest(_message.Message):
    __slots__ = ("job_id", "lease_token", "type", "payload", "request_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    lease_token: str
    type: str
    payload: _struct_pb2.Struct
    request_id: str
    def __init__(self, job_id: _Optional[str] = ..., lease_token: _Optional[str] = ..., type: _Optional[str] = ..., payload: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class AppendEventResponse(_message.Message):
    __slots__ = ("sequence", "cancel_requested")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    cancel_requested: bool
    def __init__(self, sequence: _Optional[int] = ..., cancel_requested: _Optional[bool] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("job_id", "lease_token", "result")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    lease_token: str
    result: _struct_pb2.Struct
    def __init__(self, job_id: _Optional[str] = ..., lease_token: _Optional[str] = ..., result: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _jobs_pb2.Job
    def __init__(self, job: _Optional[_Union[_jobs_pb2.Job, _Mapping]] = ...) -> None: ...

class FailRequest(_message.Message):
    __slots__ = ("job_id", "lease_token", "error_message", "error_type", "non_retryable", "retry_after_seconds")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    NON_RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    lease_token: str
    error_message: str
    error_type: str
    non_retryable: bool
    retry_after_seconds: float
    def __init__(self, job_id: _Optional[str] = ..., lease_token: _Optional[str] = ..., error_message: _Optional[str] = ..., error_type: _Optional[str] = ..., non_retryable: _Optional[bool] = ..., retry_after_seconds: _Optional[float] = ...) -> None: ...

class FailResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _jobs_pb2.Job
    def __init__(self, job: _Optional[_Union[_jobs_pb2.Job, _Mapping]] = ...) -> None: ...

class SnoozeRequest(_message.Message):
    __slots__ = ("job_id", "lease_token", "delay_seconds")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DELAY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    lease_token: str
    delay_seconds: float
    def __init__(self, job_id: _Optional[str] = ..., lease_token: _Optional[str] = ..., delay_seconds: _Optional[float] = ...) -> None: ...

class SnoozeResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _jobs_pb2.Job
    def __init__(self, job: _Optional[_Union[_jobs_pb2.Job, _Mapping]] = ...) -> None: ...

class ConfirmCancelRequest(_message.Message):
    __slots__ = ("job_id", "lease_token")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    lease_token: str
    def __init__(self, job_id: _Optional[str] = ..., lease_token: _Optional[str] = ...) -> None: ...

class ConfirmCancelResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _jobs_pb2.Job
    def __init__(self, job: _Optional[_Union[_jobs_pb2.Job, _Mapping]] = ...) -> None: ...

class FinishRequest(_message.Message):
    __slots__ = ("outcomes",)
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[Outcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[Outcome, _Mapping]]] = ...) -> None: ...

class Outcome(_message.Message):
    __slots__ = ("complete", "fail", "snooze", "confirm_cancel")
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    FAIL_FIELD_NUMBER: _ClassVar[int]
    SNOOZE_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_CANCEL_FIELD_NUMBER: _ClassVar[int]
    complete: CompleteRequest
    fail: FailRequest
    snooze: SnoozeRequest
    confirm_cancel: ConfirmCancelRequest
    def __init__(self, complete: _Optional[_Union[CompleteRequest, _Mapping]] = ..., fail: _Optional[_Union[FailRequest, _Mapping]] = ..., snooze: _Optional[_Union[SnoozeRequest, _Mapping]] = ..., confirm_cancel: _Optional[_Union[ConfirmCancelRequest, _Mapping]] = ...) -> None: ...

class FinishResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[OutcomeResult]
    def __init__(self, results: _Optional[_Iterable[_Union[OutcomeResult, _Mapping]]] = ...) -> None: ...

class OutcomeResult(_message.Message):
    __slots__ = ("job_id", "job", "lost", "invalid")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    INVALID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    job: _jobs_pb2.Job
    lost: bool
    invalid: FieldViolation
    def __init__(self, job_id: _Optional[str] = ..., job: _Optional[_Union[_jobs_pb2.Job, _Mapping]] = ..., lost: _Optional[bool] = ..., invalid: _Optional[_Union[FieldViolation, _Mapping]] = ...) -> None: ...

class FieldViolation(_message.Message):
    __slots__ = ("field", "description")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    field: str
    description: str
    def __init__(self, field: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class GetServerInfoRequest(_message.Message):
    __slots__ = ("protocol_version",)
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    def __init__(self, protocol_version: _Optional[int] = ...) -> None: ...

class GetServerInfoResponse(_message.Message):
    __slots__ = ("server_version", "protocol_version", "features")
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    server_version: str
    protocol_version: int
    features: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, server_version: _Optional[str] = ..., protocol_version: _Optional[int] = ..., features: _Optional[_Iterable[str]] = ...) -> None: ...
