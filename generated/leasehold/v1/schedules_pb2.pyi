import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from leasehold.v1 import jobs_pb2 as _jobs_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OverlapPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OVERLAP_POLICY_UNSPECIFIED: _ClassVar[OverlapPolicy]
    OVERLAP_POLICY_SKIP: _ClassVar[OverlapPolicy]
    OVERLAP_POLICY_ALLOW: _ClassVar[OverlapPolicy]

class SkipReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SKIP_REASON_UNSPECIFIED: _ClassVar[SkipReason]
    SKIP_REASON_CATCHUP_WINDOW: _ClassVar[SkipReason]
    SKIP_REASON_OVERLAP: _ClassVar[SkipReason]
OVERLAP_POLICY_UNSPECIFIED: OverlapPolicy
OVERLAP_POLICY_SKIP: OverlapPolicy
OVERLAP_POLICY_ALLOW: OverlapPolicy
SKIP_REASON_UNSPECIFIED: SkipReason
SKIP_REASON_CATCHUP_WINDOW: SkipReason
SKIP_REASON_OVERLAP: SkipReason

class ScheduleJob(_message.Message):
    __slots__ = ("kind", "payload", "max_attempts", "timeout_seconds", "priority", "retry_policy")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    RETRY_POLICY_FIELD_NUMBER: _ClassVar[int]
    kind: str
    payload: _struct_pb2.Struct
    max_attempts: int
    timeout_seconds: int
    priority: int
    retry_policy: _jobs_pb2.RetryPolicy
    def __init__(self, kind: _Optional[str] = ..., payload: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., max_attempts: _Optional[int] = ..., timeout_seconds: _Optional[int] = ..., priority: _Optional[int] = ..., retry_policy: _Optional[_Union[_jobs_pb2.RetryPolicy, _Mapping]] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ("schedule_id", "cron", "time_zone", "job", "overlap", "catchup_window_seconds", "paused", "next_fire_at", "last_fire_at", "last_job_id", "skipped_firings", "last_skipped_fire_at", "last_skip_reason", "created_at", "updated_at")
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    TIME_ZONE_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_FIELD_NUMBER: _ClassVar[int]
    CATCHUP_WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIRE_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_FIRE_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIRINGS_FIELD_NUMBER: _ClassVar[int]
    LAST_SKIPPED_FIRE_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_SKIP_REASON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    cron: str
    time_zone: str
    job: ScheduleJob
    overlap: OverlapPolicy
    catchup_window_seconds: int
    paused: bool
    next_fire_at: _timestamp_pb2.Timestamp
    last_fire_at: _timestamp_pb2.Timestamp
    last_job_id: str
    skipped_firings: int
    last_skipped_fire_at: _timestamp_pb2.Timestamp
    last_skip_reason: SkipReason
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, schedule_id: _Optional[str] = ..., cron: _Optional[str] = ..., time_zone: _Optional[str] = ..., job: _Optional[_Union[ScheduleJob, _Mapping]] = ..., overlap: _Optional[_Union[OverlapPolicy, str]] = ..., catchup_window_seconds: _Optional[int] = ..., paused: _Optional[bool] = ..., next_fire_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_fire_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_job_id: _Optional[str] = ..., skipped_firings: _Optional[int] = ..., last_skipped_fire_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_skip_reason: _Optional[_Union[SkipReason, str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateScheduleRequest(_message.Message):
    __slots__ = ("schedule_id", "cron", "time_zone", "job", "overlap", "catchup_window_seconds", "paused")
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    TIME_ZONE_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_FIELD_NUMBER: _ClassVar[int]
    CATCHUP_WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    cron: str
    time_zone: str
    job: ScheduleJob
    overlap: OverlapPolicy
    catchup_window_seconds: int
    paused: bool
    def __init__(self, schedule_id: _Optional[str] = ..., cron: _Optional[str] = ..., time_zone: _Optional[str] = ..., job: _Optional[_Union[ScheduleJob, _Mapping]] = ..., overlap: _Optional[_Union[OverlapPolicy, str]] = ..., catchup_window_seconds: _Optional[int] = ..., paused: _Optional[bool] = ...) -> None: ...

class CreateScheduleResponse(_message.Message):
    __slots__ = ("schedule",)
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...

class GetScheduleRequest(_message.Message):
    __slots__ = ("schedule_id",)
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    def __init__(self, schedule_id: _Optional[str] = ...) -> None: ...

class GetScheduleResponse(_message.Message):
    __slots__ = ("schedule",)
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...

class ListSchedulesRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSchedulesResponse(_message.Message):
    __slots__ = ("schedules", "next_page_token")
    SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    schedules: _containers.RepeatedCompositeFieldContainer[Schedule]
    next_page_token: str
    def __init__(self, schedules: _Optional[_Iterable[_Union[Schedule, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class PauseScheduleRequest(_message.Message):
    __slots__ = ("schedule_id",)
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    def __init__(self, schedule_id: _Optional[str] = ...) -> None: ...

class PauseScheduleResponse(_message.Message):
    __slots__ = ("schedule",)
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...

class ResumeScheduleRequest(_message.Message):
    __slots__ = ("schedule_id",)
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    def __init__(self, schedule_id: _Optional[str] = ...) -> None: ...

class ResumeScheduleResponse(_message.Message):
    __slots__ = ("schedule",)
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...

class DeleteScheduleRequest(_message.Message):
    __slots__ = ("schedule_id",)
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    def __init__(self, schedule_id: _Optional[str] = ...) -> None: ...

class DeleteScheduleResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TriggerScheduleRequest(_message.Message):
    __slots__ = ("schedule_id",)
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    def __init__(self, schedule_id: _Optional[str] = ...) -> None: ...

class TriggerScheduleResponse(_message.Message):
    __slots__ = ("schedule", "job")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    job: _jobs_pb2.Job
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., job: _Optional[_Union[_jobs_pb2.Job, _Mapping]] = ...) -> None: ...
