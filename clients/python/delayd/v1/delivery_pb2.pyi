from delayd.v1 import task_pb2 as _task_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
TOKEN_STATUS_MALFORMED: TokenStatus
TOKEN_STATUS_NOT_FOUND: TokenStatus
TOKEN_STATUS_OK: TokenStatus
TOKEN_STATUS_STALE: TokenStatus
TOKEN_STATUS_UNSPECIFIED: TokenStatus

class AckTasksRequest(_message.Message):
    __slots__ = ["namespace", "tokens"]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    tokens: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespace: _Optional[str] = ..., tokens: _Optional[_Iterable[str]] = ...) -> None: ...

class AckTasksResponse(_message.Message):
    __slots__ = ["results"]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[TokenResult]
    def __init__(self, results: _Optional[_Iterable[_Union[TokenResult, _Mapping]]] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ["lease_deadline", "task", "token"]
    LEASE_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    lease_deadline: _timestamp_pb2.Timestamp
    task: _task_pb2.Task
    token: str
    def __init__(self, task: _Optional[_Union[_task_pb2.Task, _Mapping]] = ..., token: _Optional[str] = ..., lease_deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ExtendLeaseRequest(_message.Message):
    __slots__ = ["extend_by", "namespace", "tokens"]
    EXTEND_BY_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    extend_by: _duration_pb2.Duration
    namespace: str
    tokens: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespace: _Optional[str] = ..., tokens: _Optional[_Iterable[str]] = ..., extend_by: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ExtendLeaseResponse(_message.Message):
    __slots__ = ["results"]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[TokenResult]
    def __init__(self, results: _Optional[_Iterable[_Union[TokenResult, _Mapping]]] = ...) -> None: ...

class NackTasksRequest(_message.Message):
    __slots__ = ["namespace", "reason", "retry_after", "tokens"]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    reason: str
    retry_after: _duration_pb2.Duration
    tokens: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespace: _Optional[str] = ..., tokens: _Optional[_Iterable[str]] = ..., retry_after: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class NackTasksResponse(_message.Message):
    __slots__ = ["results"]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[TokenResult]
    def __init__(self, results: _Optional[_Iterable[_Union[TokenResult, _Mapping]]] = ...) -> None: ...

class StreamDeliveriesRequest(_message.Message):
    __slots__ = ["ack_tokens", "extends", "kinds", "max_batch", "max_in_flight", "nacks", "namespace"]
    ACK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EXTENDS_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    NACKS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ack_tokens: _containers.RepeatedScalarFieldContainer[str]
    extends: _containers.RepeatedCompositeFieldContainer[StreamExtend]
    kinds: _containers.RepeatedScalarFieldContainer[str]
    max_batch: int
    max_in_flight: int
    nacks: _containers.RepeatedCompositeFieldContainer[StreamNack]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ..., max_in_flight: _Optional[int] = ..., kinds: _Optional[_Iterable[str]] = ..., max_batch: _Optional[int] = ..., ack_tokens: _Optional[_Iterable[str]] = ..., nacks: _Optional[_Iterable[_Union[StreamNack, _Mapping]]] = ..., extends: _Optional[_Iterable[_Union[StreamExtend, _Mapping]]] = ...) -> None: ...

class StreamDeliveriesResponse(_message.Message):
    __slots__ = ["ack_results", "deliveries", "extend_results", "nack_results"]
    ACK_RESULTS_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    EXTEND_RESULTS_FIELD_NUMBER: _ClassVar[int]
    NACK_RESULTS_FIELD_NUMBER: _ClassVar[int]
    ack_results: _containers.RepeatedCompositeFieldContainer[TokenResult]
    deliveries: _containers.RepeatedCompositeFieldContainer[Delivery]
    extend_results: _containers.RepeatedCompositeFieldContainer[TokenResult]
    nack_results: _containers.RepeatedCompositeFieldContainer[TokenResult]
    def __init__(self, deliveries: _Optional[_Iterable[_Union[Delivery, _Mapping]]] = ..., ack_results: _Optional[_Iterable[_Union[TokenResult, _Mapping]]] = ..., nack_results: _Optional[_Iterable[_Union[TokenResult, _Mapping]]] = ..., extend_results: _Optional[_Iterable[_Union[TokenResult, _Mapping]]] = ...) -> None: ...

class StreamExtend(_message.Message):
    __slots__ = ["extend_by", "tokens"]
    EXTEND_BY_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    extend_by: _duration_pb2.Duration
    tokens: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tokens: _Optional[_Iterable[str]] = ..., extend_by: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class StreamNack(_message.Message):
    __slots__ = ["reason", "retry_after", "tokens"]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    reason: str
    retry_after: _duration_pb2.Duration
    tokens: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tokens: _Optional[_Iterable[str]] = ..., retry_after: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ["kinds", "max_in_flight", "namespace"]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    kinds: _containers.RepeatedScalarFieldContainer[str]
    max_in_flight: int
    namespace: str
    def __init__(self, namespace: _Optional[str] = ..., max_in_flight: _Optional[int] = ..., kinds: _Optional[_Iterable[str]] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ["delivery"]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    delivery: Delivery
    def __init__(self, delivery: _Optional[_Union[Delivery, _Mapping]] = ...) -> None: ...

class TokenResult(_message.Message):
    __slots__ = ["lease_deadline", "status", "token"]
    LEASE_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    lease_deadline: _timestamp_pb2.Timestamp
    status: TokenStatus
    token: str
    def __init__(self, token: _Optional[str] = ..., status: _Optional[_Union[TokenStatus, str]] = ..., lease_deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WatchDeliveriesRequest(_message.Message):
    __slots__ = ["namespace"]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class WatchDeliveriesResponse(_message.Message):
    __slots__ = ["delivery_time", "lease_deadline", "missed", "task"]
    DELIVERY_TIME_FIELD_NUMBER: _ClassVar[int]
    LEASE_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    MISSED_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    delivery_time: _timestamp_pb2.Timestamp
    lease_deadline: _timestamp_pb2.Timestamp
    missed: int
    task: _task_pb2.Task
    def __init__(self, task: _Optional[_Union[_task_pb2.Task, _Mapping]] = ..., lease_deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., delivery_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., missed: _Optional[int] = ...) -> None: ...

class TokenStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
