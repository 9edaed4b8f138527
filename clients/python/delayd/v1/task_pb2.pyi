from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
TASK_EVENT_KIND_ACKED: TaskEventKind
TASK_EVENT_KIND_DEAD_LETTERED: TaskEventKind
TASK_EVENT_KIND_DELIVERED: TaskEventKind
TASK_EVENT_KIND_LEASE_EXPIRED: TaskEventKind
TASK_EVENT_KIND_NACKED: TaskEventKind
TASK_EVENT_KIND_REMOVED: TaskEventKind
TASK_EVENT_KIND_REQUEUED: TaskEventKind
TASK_EVENT_KIND_RESCHEDULED: TaskEventKind
TASK_EVENT_KIND_UNSPECIFIED: TaskEventKind
TASK_EVENT_KIND_UPSERTED: TaskEventKind
TASK_STATE_DEAD: TaskState
TASK_STATE_DELIVERED: TaskState
TASK_STATE_SCHEDULED: TaskState
TASK_STATE_UNSPECIFIED: TaskState
TASK_VIEW_BASIC: TaskView
TASK_VIEW_FULL: TaskView
TASK_VIEW_UNSPECIFIED: TaskView

class BatchUpsertTaskResult(_message.Message):
    __slots__ = ["created", "error", "task"]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    created: bool
    error: ItemError
    task: Task
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., created: bool = ..., error: _Optional[_Union[ItemError, _Mapping]] = ...) -> None: ...

class BatchUpsertTasksRequest(_message.Message):
    __slots__ = ["namespace", "tasks"]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    tasks: _containers.RepeatedCompositeFieldContainer[UpsertTaskRequest]
    def __init__(self, namespace: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[UpsertTaskRequest, _Mapping]]] = ...) -> None: ...

class BatchUpsertTasksResponse(_message.Message):
    __slots__ = ["results"]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BatchUpsertTaskResult]
    def __init__(self, results: _Optional[_Iterable[_Union[BatchUpsertTaskResult, _Mapping]]] = ...) -> None: ...

class GetTaskHistoryRequest(_message.Message):
    __slots__ = ["id", "namespace", "page_size", "page_token"]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    id: str
    namespace: str
    page_size: int
    page_token: str
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class GetTaskHistoryResponse(_message.Message):
    __slots__ = ["events", "history_enabled", "next_page_token"]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_ENABLED_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[TaskEvent]
    history_enabled: bool
    next_page_token: str
    def __init__(self, events: _Optional[_Iterable[_Union[TaskEvent, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., history_enabled: bool = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ["id", "namespace"]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    id: str
    namespace: str
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class GetTaskResponse(_message.Message):
    __slots__ = ["task"]
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: Task
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class ItemError(_message.Message):
    __slots__ = ["code", "message"]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ["namespace", "page_size", "page_token", "state", "view"]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    page_size: int
    page_token: str
    state: TaskState
    view: TaskView
    def __init__(self, namespace: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., view: _Optional[_Union[TaskView, str]] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ["next_page_token", "tasks"]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    next_page_token: str
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    def __init__(self, tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RemoveTaskRequest(_message.Message):
    __slots__ = ["id", "if_generation", "if_incarnation", "namespace"]
    ID_FIELD_NUMBER: _ClassVar[int]
    IF_GENERATION_FIELD_NUMBER: _ClassVar[int]
    IF_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    id: str
    if_generation: int
    if_incarnation: int
    namespace: str
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., if_generation: _Optional[int] = ..., if_incarnation: _Optional[int] = ...) -> None: ...

class RemoveTaskResponse(_message.Message):
    __slots__ = ["previous_state", "removed"]
    PREVIOUS_STATE_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    previous_state: TaskState
    removed: bool
    def __init__(self, removed: bool = ..., previous_state: _Optional[_Union[TaskState, str]] = ...) -> None: ...

class RemoveTaskResult(_message.Message):
    __slots__ = ["id", "previous_state", "removed"]
    ID_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_STATE_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    id: str
    previous_state: TaskState
    removed: bool
    def __init__(self, id: _Optional[str] = ..., removed: bool = ..., previous_state: _Optional[_Union[TaskState, str]] = ...) -> None: ...

class RemoveTasksRequest(_message.Message):
    __slots__ = ["filter", "ids", "namespace", "page_token"]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    filter: TaskFilter
    ids: _containers.RepeatedScalarFieldContainer[str]
    namespace: str
    page_token: str
    def __init__(self, namespace: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ..., filter: _Optional[_Union[TaskFilter, _Mapping]] = ..., page_token: _Optional[str] = ...) -> None: ...

class RemoveTasksResponse(_message.Message):
    __slots__ = ["next_page_token", "removed", "results"]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    next_page_token: str
    removed: int
    results: _containers.RepeatedCompositeFieldContainer[RemoveTaskResult]
    def __init__(self, removed: _Optional[int] = ..., next_page_token: _Optional[str] = ..., results: _Optional[_Iterable[_Union[RemoveTaskResult, _Mapping]]] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ["attempt", "create_time", "dead_time", "due_time", "generation", "id", "incarnation", "kind", "last_error", "lease_deadline", "namespace", "payload", "state", "traceparent", "update_time"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    DEAD_TIME_FIELD_NUMBER: _ClassVar[int]
    DUE_TIME_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    LEASE_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    create_time: _timestamp_pb2.Timestamp
    dead_time: _timestamp_pb2.Timestamp
    due_time: _timestamp_pb2.Timestamp
    generation: int
    id: str
    incarnation: int
    kind: str
    last_error: str
    lease_deadline: _timestamp_pb2.Timestamp
    namespace: str
    payload: bytes
    state: TaskState
    traceparent: str
    update_time: _timestamp_pb2.Timestamp
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., kind: _Optional[str] = ..., payload: _Optional[bytes] = ..., due_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., state: _Optional[_Union[TaskState, str]] = ..., attempt: _Optional[int] = ..., generation: _Optional[int] = ..., create_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., last_error: _Optional[str] = ..., lease_deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., dead_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., traceparent: _Optional[str] = ..., incarnation: _Optional[int] = ...) -> None: ...

class TaskEvent(_message.Message):
    __slots__ = ["attempt", "due_time", "generation", "key_id", "kind", "lateness", "reason", "replica", "retry_after", "schedule_id", "slot_time", "time"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DUE_TIME_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LATENESS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    SLOT_TIME_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    due_time: _timestamp_pb2.Timestamp
    generation: int
    key_id: str
    kind: TaskEventKind
    lateness: _duration_pb2.Duration
    reason: str
    replica: str
    retry_after: _duration_pb2.Duration
    schedule_id: str
    slot_time: _timestamp_pb2.Timestamp
    time: _timestamp_pb2.Timestamp
    def __init__(self, kind: _Optional[_Union[TaskEventKind, str]] = ..., time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., key_id: _Optional[str] = ..., generation: _Optional[int] = ..., due_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., attempt: _Optional[int] = ..., replica: _Optional[str] = ..., lateness: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., reason: _Optional[str] = ..., retry_after: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., schedule_id: _Optional[str] = ..., slot_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class TaskFilter(_message.Message):
    __slots__ = ["id_prefix", "kind", "state"]
    ID_PREFIX_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    id_prefix: str
    kind: str
    state: TaskState
    def __init__(self, kind: _Optional[str] = ..., id_prefix: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ...) -> None: ...

class UpsertTaskRequest(_message.Message):
    __slots__ = ["create_only", "delay", "due_time", "id", "if_generation", "if_incarnation", "kind", "namespace", "payload"]
    CREATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    DUE_TIME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    IF_GENERATION_FIELD_NUMBER: _ClassVar[int]
    IF_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    create_only: bool
    delay: _duration_pb2.Duration
    due_time: _timestamp_pb2.Timestamp
    id: str
    if_generation: int
    if_incarnation: int
    kind: str
    namespace: str
    payload: bytes
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., kind: _Optional[str] = ..., payload: _Optional[bytes] = ..., due_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., delay: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., create_only: bool = ..., if_generation: _Optional[int] = ..., if_incarnation: _Optional[int] = ...) -> None: ...

class UpsertTaskResponse(_message.Message):
    __slots__ = ["created", "task"]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    created: bool
    task: Task
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., created: bool = ...) -> None: ...

class TaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class TaskView(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class TaskEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
