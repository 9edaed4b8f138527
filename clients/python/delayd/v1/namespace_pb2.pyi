from delayd.v1 import task_pb2 as _task_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import field_mask_pb2 as _field_mask_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
KEY_SCOPE_ADMIN: KeyScope
KEY_SCOPE_CONSUME: KeyScope
KEY_SCOPE_PRODUCE: KeyScope
KEY_SCOPE_UNSPECIFIED: KeyScope

class CreateKeyRequest(_message.Message):
    __slots__ = ["description", "namespace", "scopes"]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    description: str
    namespace: str
    scopes: _containers.RepeatedScalarFieldContainer[KeyScope]
    def __init__(self, namespace: _Optional[str] = ..., scopes: _Optional[_Iterable[_Union[KeyScope, str]]] = ..., description: _Optional[str] = ...) -> None: ...

class CreateKeyResponse(_message.Message):
    __slots__ = ["key", "secret"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    key: Key
    secret: str
    def __init__(self, key: _Optional[_Union[Key, _Mapping]] = ..., secret: _Optional[str] = ...) -> None: ...

class CreateNamespaceRequest(_message.Message):
    __slots__ = ["namespace"]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: Namespace
    def __init__(self, namespace: _Optional[_Union[Namespace, _Mapping]] = ...) -> None: ...

class CreateNamespaceResponse(_message.Message):
    __slots__ = ["namespace"]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: Namespace
    def __init__(self, namespace: _Optional[_Union[Namespace, _Mapping]] = ...) -> None: ...

class DeleteNamespaceRequest(_message.Message):
    __slots__ = ["force", "namespace"]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    force: bool
    namespace: str
    def __init__(self, namespace: _Optional[str] = ..., force: bool = ...) -> None: ...

class DeleteNamespaceResponse(_message.Message):
    __slots__ = ["deleted_tasks"]
    DELETED_TASKS_FIELD_NUMBER: _ClassVar[int]
    deleted_tasks: int
    def __init__(self, deleted_tasks: _Optional[int] = ...) -> None: ...

class GetNamespaceRequest(_message.Message):
    __slots__ = ["namespace"]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class GetNamespaceResponse(_message.Message):
    __slots__ = ["namespace"]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: Namespace
    def __init__(self, namespace: _Optional[_Union[Namespace, _Mapping]] = ...) -> None: ...

class GetNamespaceStatsRequest(_message.Message):
    __slots__ = ["namespace"]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class GetNamespaceStatsResponse(_message.Message):
    __slots__ = ["dead", "delivered", "due_by_kind", "due_by_kind_partial", "due_now", "due_per_hour", "due_per_minute", "firings_partial", "firings_per_hour", "firings_per_minute", "forecast_time", "max_dispatch_rate", "oldest_due_lateness", "paused", "push", "recent_delivery_rate", "recent_lateness_p50", "recent_lateness_p90", "recent_lateness_p99", "recent_window", "scheduled"]
    class DueByKindEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    DEAD_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_FIELD_NUMBER: _ClassVar[int]
    DUE_BY_KIND_FIELD_NUMBER: _ClassVar[int]
    DUE_BY_KIND_PARTIAL_FIELD_NUMBER: _ClassVar[int]
    DUE_NOW_FIELD_NUMBER: _ClassVar[int]
    DUE_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    DUE_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    FIRINGS_PARTIAL_FIELD_NUMBER: _ClassVar[int]
    FIRINGS_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    FIRINGS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    FORECAST_TIME_FIELD_NUMBER: _ClassVar[int]
    MAX_DISPATCH_RATE_FIELD_NUMBER: _ClassVar[int]
    OLDEST_DUE_LATENESS_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    PUSH_FIELD_NUMBER: _ClassVar[int]
    RECENT_DELIVERY_RATE_FIELD_NUMBER: _ClassVar[int]
    RECENT_LATENESS_P50_FIELD_NUMBER: _ClassVar[int]
    RECENT_LATENESS_P90_FIELD_NUMBER: _ClassVar[int]
    RECENT_LATENESS_P99_FIELD_NUMBER: _ClassVar[int]
    RECENT_WINDOW_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    dead: int
    delivered: int
    due_by_kind: _containers.ScalarMap[str, int]
    due_by_kind_partial: bool
    due_now: int
    due_per_hour: _containers.RepeatedScalarFieldContainer[int]
    due_per_minute: _containers.RepeatedScalarFieldContainer[int]
    firings_partial: bool
    firings_per_hour: _containers.RepeatedScalarFieldContainer[int]
    firings_per_minute: _containers.RepeatedScalarFieldContainer[int]
    forecast_time: _timestamp_pb2.Timestamp
    max_dispatch_rate: float
    oldest_due_lateness: _duration_pb2.Duration
    paused: bool
    push: bool
    recent_delivery_rate: float
    recent_lateness_p50: _duration_pb2.Duration
    recent_lateness_p90: _duration_pb2.Duration
    recent_lateness_p99: _duration_pb2.Duration
    recent_window: _duration_pb2.Duration
    scheduled: int
    def __init__(self, scheduled: _Optional[int] = ..., delivered: _Optional[int] = ..., dead: _Optional[int] = ..., due_now: _Optional[int] = ..., oldest_due_lateness: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., paused: bool = ..., due_by_kind: _Optional[_Mapping[str, int]] = ..., due_by_kind_partial: bool = ..., max_dispatch_rate: _Optional[float] = ..., push: bool = ..., due_per_minute: _Optional[_Iterable[int]] = ..., due_per_hour: _Optional[_Iterable[int]] = ..., forecast_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., recent_delivery_rate: _Optional[float] = ..., recent_lateness_p50: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., recent_lateness_p90: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., recent_lateness_p99: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., recent_window: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., firings_per_minute: _Optional[_Iterable[int]] = ..., firings_per_hour: _Optional[_Iterable[int]] = ..., firings_partial: bool = ...) -> None: ...

class Key(_message.Message):
    __slots__ = ["create_time", "description", "id", "namespace", "scopes"]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    create_time: _timestamp_pb2.Timestamp
    description: str
    id: str
    namespace: str
    scopes: _containers.RepeatedScalarFieldContainer[KeyScope]
    def __init__(self, id: _Optional[str] = ..., namespace: _Optional[str] = ..., scopes: _Optional[_Iterable[_Union[KeyScope, str]]] = ..., description: _Optional[str] = ..., create_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListDeadLettersRequest(_message.Message):
    __slots__ = ["namespace", "page_size", "page_token", "view"]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    page_size: int
    page_token: str
    view: _task_pb2.TaskView
    def __init__(self, namespace: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., view: _Optional[_Union[_task_pb2.TaskView, str]] = ...) -> None: ...

class ListDeadLettersResponse(_message.Message):
    __slots__ = ["next_page_token", "tasks"]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    next_page_token: str
    tasks: _containers.RepeatedCompositeFieldContainer[_task_pb2.Task]
    def __init__(self, tasks: _Optional[_Iterable[_Union[_task_pb2.Task, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListKeysRequest(_message.Message):
    __slots__ = ["namespace", "page_size", "page_token"]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    page_size: int
    page_token: str
    def __init__(self, namespace: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListKeysResponse(_message.Message):
    __slots__ = ["keys", "next_page_token"]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[Key]
    next_page_token: str
    def __init__(self, keys: _Optional[_Iterable[_Union[Key, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListNamespacesRequest(_message.Message):
    __slots__ = ["page_size", "page_token"]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListNamespacesResponse(_message.Message):
    __slots__ = ["namespaces", "next_page_token"]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    namespaces: _containers.RepeatedCompositeFieldContainer[Namespace]
    next_page_token: str
    def __init__(self, namespaces: _Optional[_Iterable[_Union[Namespace, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class Namespace(_message.Message):
    __slots__ = ["create_time", "name", "policy", "update_time"]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    create_time: _timestamp_pb2.Timestamp
    name: str
    policy: NamespacePolicy
    update_time: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., policy: _Optional[_Union[NamespacePolicy, _Mapping]] = ..., create_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class NamespacePolicy(_message.Message):
    __slots__ = ["ack_timeout", "backoff_initial", "backoff_max", "backoff_multiplier", "history_retention_bytes", "max_attempts", "max_delay", "max_dispatch_rate", "max_payload_bytes", "max_pending_tasks", "max_schedules", "max_subscribers", "paused", "push", "rate_burst", "rate_limit", "shards"]
    ACK_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_INITIAL_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_MAX_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    HISTORY_RETENTION_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    MAX_DELAY_FIELD_NUMBER: _ClassVar[int]
    MAX_DISPATCH_RATE_FIELD_NUMBER: _ClassVar[int]
    MAX_PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_PENDING_TASKS_FIELD_NUMBER: _ClassVar[int]
    MAX_SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    MAX_SUBSCRIBERS_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    PUSH_FIELD_NUMBER: _ClassVar[int]
    RATE_BURST_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    ack_timeout: _duration_pb2.Duration
    backoff_initial: _duration_pb2.Duration
    backoff_max: _duration_pb2.Duration
    backoff_multiplier: float
    history_retention_bytes: int
    max_attempts: int
    max_delay: _duration_pb2.Duration
    max_dispatch_rate: float
    max_payload_bytes: int
    max_pending_tasks: int
    max_schedules: int
    max_subscribers: int
    paused: bool
    push: PushTarget
    rate_burst: int
    rate_limit: float
    shards: int
    def __init__(self, ack_timeout: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., max_attempts: _Optional[int] = ..., backoff_initial: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., backoff_max: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., backoff_multiplier: _Optional[float] = ..., max_payload_bytes: _Optional[int] = ..., max_pending_tasks: _Optional[int] = ..., rate_limit: _Optional[float] = ..., rate_burst: _Optional[int] = ..., max_subscribers: _Optional[int] = ..., max_delay: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., paused: bool = ..., max_dispatch_rate: _Optional[float] = ..., shards: _Optional[int] = ..., push: _Optional[_Union[PushTarget, _Mapping]] = ..., history_retention_bytes: _Optional[int] = ..., max_schedules: _Optional[int] = ...) -> None: ...

class PurgeDeadLettersRequest(_message.Message):
    __slots__ = ["all", "ids", "namespace"]
    ALL_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    all: bool
    ids: _containers.RepeatedScalarFieldContainer[str]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ..., all: bool = ...) -> None: ...

class PurgeDeadLettersResponse(_message.Message):
    __slots__ = ["purged"]
    PURGED_FIELD_NUMBER: _ClassVar[int]
    purged: int
    def __init__(self, purged: _Optional[int] = ...) -> None: ...

class PushTarget(_message.Message):
    __slots__ = ["secret", "secret_set", "url"]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    SECRET_SET_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    secret: str
    secret_set: bool
    url: str
    def __init__(self, url: _Optional[str] = ..., secret: _Optional[str] = ..., secret_set: bool = ...) -> None: ...

class RequeueDeadLettersRequest(_message.Message):
    __slots__ = ["all", "delay", "ids", "namespace"]
    ALL_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    all: bool
    delay: _duration_pb2.Duration
    ids: _containers.RepeatedScalarFieldContainer[str]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ..., all: bool = ..., delay: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class RequeueDeadLettersResponse(_message.Message):
    __slots__ = ["requeued"]
    REQUEUED_FIELD_NUMBER: _ClassVar[int]
    requeued: int
    def __init__(self, requeued: _Optional[int] = ...) -> None: ...

class RevokeKeyRequest(_message.Message):
    __slots__ = ["id"]
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class RevokeKeyResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class UpdateNamespaceRequest(_message.Message):
    __slots__ = ["namespace", "update_mask"]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    namespace: Namespace
    update_mask: _field_mask_pb2.FieldMask
    def __init__(self, namespace: _Optional[_Union[Namespace, _Mapping]] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ...) -> None: ...

class UpdateNamespaceResponse(_message.Message):
    __slots__ = ["namespace"]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: Namespace
    def __init__(self, namespace: _Optional[_Union[Namespace, _Mapping]] = ...) -> None: ...

class WhoAmIRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class WhoAmIResponse(_message.Message):
    __slots__ = ["auth_enabled", "key"]
    AUTH_ENABLED_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    auth_enabled: bool
    key: Key
    def __init__(self, key: _Optional[_Union[Key, _Mapping]] = ..., auth_enabled: bool = ...) -> None: ...

class KeyScope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
