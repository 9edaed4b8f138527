from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import field_mask_pb2 as _field_mask_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

CATCH_UP_POLICY_ALL: CatchUpPolicy
CATCH_UP_POLICY_LATEST: CatchUpPolicy
CATCH_UP_POLICY_NONE: CatchUpPolicy
CATCH_UP_POLICY_UNSPECIFIED: CatchUpPolicy
DESCRIPTOR: _descriptor.FileDescriptor
OVERLAP_POLICY_ALLOW: OverlapPolicy
OVERLAP_POLICY_SKIP: OverlapPolicy
OVERLAP_POLICY_UNSPECIFIED: OverlapPolicy
SCHEDULE_STATE_ACTIVE: ScheduleState
SCHEDULE_STATE_DONE: ScheduleState
SCHEDULE_STATE_PAUSED: ScheduleState
SCHEDULE_STATE_UNSPECIFIED: ScheduleState

class CreateScheduleRequest(_message.Message):
    __slots__ = ["paused", "schedule"]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    paused: bool
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., paused: bool = ...) -> None: ...

class CreateScheduleResponse(_message.Message):
    __slots__ = ["schedule"]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...

class DeleteScheduleRequest(_message.Message):
    __slots__ = ["id", "if_version", "namespace"]
    ID_FIELD_NUMBER: _ClassVar[int]
    IF_VERSION_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    id: str
    if_version: int
    namespace: str
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., if_version: _Optional[int] = ...) -> None: ...

class DeleteScheduleResponse(_message.Message):
    __slots__ = ["removed_firings"]
    REMOVED_FIRINGS_FIELD_NUMBER: _ClassVar[int]
    removed_firings: int
    def __init__(self, removed_firings: _Optional[int] = ...) -> None: ...

class GetScheduleRequest(_message.Message):
    __slots__ = ["id", "namespace"]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    id: str
    namespace: str
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class GetScheduleResponse(_message.Message):
    __slots__ = ["schedule"]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...

class ListSchedulesRequest(_message.Message):
    __slots__ = ["namespace", "page_size", "page_token"]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    page_size: int
    page_token: str
    def __init__(self, namespace: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSchedulesResponse(_message.Message):
    __slots__ = ["next_page_token", "schedules"]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    next_page_token: str
    schedules: _containers.RepeatedCompositeFieldContainer[Schedule]
    def __init__(self, schedules: _Optional[_Iterable[_Union[Schedule, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class PauseScheduleRequest(_message.Message):
    __slots__ = ["id", "namespace"]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    id: str
    namespace: str
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class PauseScheduleResponse(_message.Message):
    __slots__ = ["removed_firings", "schedule"]
    REMOVED_FIRINGS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    removed_firings: int
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., removed_firings: _Optional[int] = ...) -> None: ...

class PreviewScheduleRequest(_message.Message):
    __slots__ = ["after", "count", "id", "namespace", "schedule"]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    after: _timestamp_pb2.Timestamp
    count: int
    id: str
    namespace: str
    schedule: Schedule
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., schedule: _Optional[_Union[Schedule, _Mapping]] = ..., count: _Optional[int] = ..., after: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PreviewScheduleResponse(_message.Message):
    __slots__ = ["firings", "time_zone", "tz_data_version"]
    FIRINGS_FIELD_NUMBER: _ClassVar[int]
    TIME_ZONE_FIELD_NUMBER: _ClassVar[int]
    TZ_DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    firings: _containers.RepeatedCompositeFieldContainer[ScheduleFiring]
    time_zone: str
    tz_data_version: str
    def __init__(self, firings: _Optional[_Iterable[_Union[ScheduleFiring, _Mapping]]] = ..., time_zone: _Optional[str] = ..., tz_data_version: _Optional[str] = ...) -> None: ...

class ResumeScheduleRequest(_message.Message):
    __slots__ = ["id", "namespace"]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    id: str
    namespace: str
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class ResumeScheduleResponse(_message.Message):
    __slots__ = ["schedule"]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ["catch_up", "catch_up_window", "create_time", "cron", "description", "end_time", "every", "fired", "id", "jitter", "last_slot_time", "last_task_id", "max_firings", "namespace", "next_slot_time", "overlap", "skipped", "start_time", "state", "task", "time_zone", "update_time", "version"]
    CATCH_UP_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_WINDOW_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    EVERY_FIELD_NUMBER: _ClassVar[int]
    FIRED_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    JITTER_FIELD_NUMBER: _ClassVar[int]
    LAST_SLOT_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_FIRINGS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NEXT_SLOT_TIME_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    TIME_ZONE_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    catch_up: CatchUpPolicy
    catch_up_window: _duration_pb2.Duration
    create_time: _timestamp_pb2.Timestamp
    cron: str
    description: str
    end_time: _timestamp_pb2.Timestamp
    every: _duration_pb2.Duration
    fired: int
    id: str
    jitter: _duration_pb2.Duration
    last_slot_time: _timestamp_pb2.Timestamp
    last_task_id: str
    max_firings: int
    namespace: str
    next_slot_time: _timestamp_pb2.Timestamp
    overlap: OverlapPolicy
    skipped: int
    start_time: _timestamp_pb2.Timestamp
    state: ScheduleState
    task: ScheduleTaskTemplate
    time_zone: str
    update_time: _timestamp_pb2.Timestamp
    version: int
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., description: _Optional[str] = ..., cron: _Optional[str] = ..., every: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., time_zone: _Optional[str] = ..., start_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., max_firings: _Optional[int] = ..., catch_up: _Optional[_Union[CatchUpPolicy, str]] = ..., catch_up_window: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., overlap: _Optional[_Union[OverlapPolicy, str]] = ..., jitter: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., task: _Optional[_Union[ScheduleTaskTemplate, _Mapping]] = ..., state: _Optional[_Union[ScheduleState, str]] = ..., fired: _Optional[int] = ..., skipped: _Optional[int] = ..., last_slot_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., last_task_id: _Optional[str] = ..., next_slot_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., version: _Optional[int] = ..., create_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ScheduleFiring(_message.Message):
    __slots__ = ["due_time", "local_time", "slot_time", "task_id"]
    DUE_TIME_FIELD_NUMBER: _ClassVar[int]
    LOCAL_TIME_FIELD_NUMBER: _ClassVar[int]
    SLOT_TIME_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    due_time: _timestamp_pb2.Timestamp
    local_time: str
    slot_time: _timestamp_pb2.Timestamp
    task_id: str
    def __init__(self, slot_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., local_time: _Optional[str] = ..., task_id: _Optional[str] = ..., due_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ScheduleTaskTemplate(_message.Message):
    __slots__ = ["id_prefix", "kind", "payload"]
    ID_PREFIX_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    id_prefix: str
    kind: str
    payload: bytes
    def __init__(self, kind: _Optional[str] = ..., payload: _Optional[bytes] = ..., id_prefix: _Optional[str] = ...) -> None: ...

class UpdateScheduleRequest(_message.Message):
    __slots__ = ["if_version", "schedule", "update_mask"]
    IF_VERSION_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    if_version: int
    schedule: Schedule
    update_mask: _field_mask_pb2.FieldMask
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ..., if_version: _Optional[int] = ...) -> None: ...

class UpdateScheduleResponse(_message.Message):
    __slots__ = ["removed_firings", "schedule"]
    REMOVED_FIRINGS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    removed_firings: int
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., removed_firings: _Optional[int] = ...) -> None: ...

class CatchUpPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class OverlapPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class ScheduleState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
