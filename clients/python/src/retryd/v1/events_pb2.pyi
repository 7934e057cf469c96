from google.protobuf import timestamp_pb2 as _timestamp_pb2
from retryd.v1 import policy_pb2 as _policy_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DelaySource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DELAY_SOURCE_UNSPECIFIED: _ClassVar[DelaySource]
    DELAY_SOURCE_BACKOFF: _ClassVar[DelaySource]
    DELAY_SOURCE_PROVIDER_RETRY_AFTER: _ClassVar[DelaySource]
    DELAY_SOURCE_SCHEDULE: _ClassVar[DelaySource]
    DELAY_SOURCE_TAIL: _ClassVar[DelaySource]
    DELAY_SOURCE_FLEET_BUDGET: _ClassVar[DelaySource]
    DELAY_SOURCE_CIRCUIT_OPEN: _ClassVar[DelaySource]
    DELAY_SOURCE_PROVIDER_PACING: _ClassVar[DelaySource]

class DelegateReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DELEGATE_REASON_UNSPECIFIED: _ClassVar[DelegateReason]
    DELEGATE_REASON_NO_PROVIDER: _ClassVar[DelegateReason]
    DELEGATE_REASON_BUDGET_EXHAUSTED: _ClassVar[DelegateReason]
    DELEGATE_REASON_CODE_NOT_RETRYABLE: _ClassVar[DelegateReason]
    DELEGATE_REASON_DOWNSTREAM_FIRST: _ClassVar[DelegateReason]
    DELEGATE_REASON_DOWNSTREAM_HANDLED: _ClassVar[DelegateReason]
    DELEGATE_REASON_RETRY_AFTER_OVER_CAP: _ClassVar[DelegateReason]
    DELEGATE_REASON_DEADLINE: _ClassVar[DelegateReason]
    DELEGATE_REASON_REPLAY_UNSAFE: _ClassVar[DelegateReason]
    DELEGATE_REASON_FLEET_BUDGET_EXHAUSTED: _ClassVar[DelegateReason]
    DELEGATE_REASON_FLEET_CIRCUIT_OPEN: _ClassVar[DelegateReason]

class CancelReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CANCEL_REASON_UNSPECIFIED: _ClassVar[CancelReason]
    CANCEL_REASON_REQUESTED: _ClassVar[CancelReason]
    CANCEL_REASON_ABANDONED: _ClassVar[CancelReason]
    CANCEL_REASON_SHUTDOWN: _ClassVar[CancelReason]
    CANCEL_REASON_EXPIRED: _ClassVar[CancelReason]

class CloseReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLOSE_REASON_UNSPECIFIED: _ClassVar[CloseReason]
    CLOSE_REASON_SUCCEEDED: _ClassVar[CloseReason]
    CLOSE_REASON_CANCELLED: _ClassVar[CloseReason]
    CLOSE_REASON_EXHAUSTED: _ClassVar[CloseReason]
    CLOSE_REASON_EXPIRED: _ClassVar[CloseReason]

class Downstream(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DOWNSTREAM_UNSPECIFIED: _ClassVar[Downstream]
    DOWNSTREAM_NOT_ASKED: _ClassVar[Downstream]
    DOWNSTREAM_DECLINED: _ClassVar[Downstream]
    DOWNSTREAM_HANDLED: _ClassVar[Downstream]

class Replay(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLAY_UNSPECIFIED: _ClassVar[Replay]
    REPLAY_SAFE: _ClassVar[Replay]
    REPLAY_UNSAFE: _ClassVar[Replay]
DELAY_SOURCE_UNSPECIFIED: DelaySource
DELAY_SOURCE_BACKOFF: DelaySource
DELAY_SOURCE_PROVIDER_RETRY_AFTER: DelaySource
DELAY_SOURCE_SCHEDULE: DelaySource
DELAY_SOURCE_TAIL: DelaySource
DELAY_SOURCE_FLEET_BUDGET: DelaySource
DELAY_SOURCE_CIRCUIT_OPEN: DelaySource
DELAY_SOURCE_PROVIDER_PACING: DelaySource
DELEGATE_REASON_UNSPECIFIED: DelegateReason
DELEGATE_REASON_NO_PROVIDER: DelegateReason
DELEGATE_REASON_BUDGET_EXHAUSTED: DelegateReason
DELEGATE_REASON_CODE_NOT_RETRYABLE: DelegateReason
DELEGATE_REASON_DOWNSTREAM_FIRST: DelegateReason
DELEGATE_REASON_DOWNSTREAM_HANDLED: DelegateReason
DELEGATE_REASON_RETRY_AFTER_OVER_CAP: DelegateReason
DELEGATE_REASON_DEADLINE: DelegateReason
DELEGATE_REASON_REPLAY_UNSAFE: DelegateReason
DELEGATE_REASON_FLEET_BUDGET_EXHAUSTED: DelegateReason
DELEGATE_REASON_FLEET_CIRCUIT_OPEN: DelegateReason
CANCEL_REASON_UNSPECIFIED: CancelReason
CANCEL_REASON_REQUESTED: CancelReason
CANCEL_REASON_ABANDONED: CancelReason
CANCEL_REASON_SHUTDOWN: CancelReason
CANCEL_REASON_EXPIRED: CancelReason
CLOSE_REASON_UNSPECIFIED: CloseReason
CLOSE_REASON_SUCCEEDED: CloseReason
CLOSE_REASON_CANCELLED: CloseReason
CLOSE_REASON_EXHAUSTED: CloseReason
CLOSE_REASON_EXPIRED: CloseReason
DOWNSTREAM_UNSPECIFIED: Downstream
DOWNSTREAM_NOT_ASKED: Downstream
DOWNSTREAM_DECLINED: Downstream
DOWNSTREAM_HANDLED: Downstream
REPLAY_UNSPECIFIED: Replay
REPLAY_SAFE: Replay
REPLAY_UNSAFE: Replay

class Failure(_message.Message):
    __slots__ = ("code", "message", "http_status", "provider_retry_after_ms", "retry_after")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    http_status: int
    provider_retry_after_ms: int
    retry_after: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., http_status: _Optional[int] = ..., provider_retry_after_ms: _Optional[int] = ..., retry_after: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("sequence", "session_id", "time", "scheduled", "delegated", "started", "cancelled", "closed")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    DELEGATED_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    session_id: str
    time: _timestamp_pb2.Timestamp
    scheduled: RetryScheduled
    delegated: RetryDelegated
    started: RetryStarted
    cancelled: RetryCancelled
    closed: ChainClosed
    def __init__(self, sequence: _Optional[int] = ..., session_id: _Optional[str] = ..., time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., scheduled: _Optional[_Union[RetryScheduled, _Mapping]] = ..., delegated: _Optional[_Union[RetryDelegated, _Mapping]] = ..., started: _Optional[_Union[RetryStarted, _Mapping]] = ..., cancelled: _Optional[_Union[RetryCancelled, _Mapping]] = ..., closed: _Optional[_Union[ChainClosed, _Mapping]] = ...) -> None: ...

class RetryScheduled(_message.Message):
    __slots__ = ("retry_id", "turn", "step", "logical_turn_id", "provider", "mode", "policy_key", "failure", "retry_number", "max_retries", "delay_ms", "delay_source", "due_at", "policy", "traceparent", "detail")
    RETRY_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    LOGICAL_TURN_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    POLICY_KEY_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    RETRY_NUMBER_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    DELAY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    DUE_AT_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    retry_id: str
    turn: int
    step: int
    logical_turn_id: str
    provider: str
    mode: _policy_pb2.Mode
    policy_key: str
    failure: Failure
    retry_number: int
    max_retries: int
    delay_ms: int
    delay_source: DelaySource
    due_at: _timestamp_pb2.Timestamp
    policy: _policy_pb2.RetryPolicy
    traceparent: str
    detail: str
    def __init__(self, retry_id: _Optional[str] = ..., turn: _Optional[int] = ..., step: _Optional[int] = ..., logical_turn_id: _Optional[str] = ..., provider: _Optional[str] = ..., mode: _Optional[_Union[_policy_pb2.Mode, str]] = ..., policy_key: _Optional[str] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ..., retry_number: _Optional[int] = ..., max_retries: _Optional[int] = ..., delay_ms: _Optional[int] = ..., delay_source: _Optional[_Union[DelaySource, str]] = ..., due_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., policy: _Optional[_Union[_policy_pb2.RetryPolicy, _Mapping]] = ..., traceparent: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class RetryDelegated(_message.Message):
    __slots__ = ("turn", "step", "provider", "policy_key", "mode", "failure", "reason", "detail", "downstream")
    TURN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    POLICY_KEY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    DOWNSTREAM_FIELD_NUMBER: _ClassVar[int]
    turn: int
    step: int
    provider: str
    policy_key: str
    mode: _policy_pb2.Mode
    failure: Failure
    reason: DelegateReason
    detail: str
    downstream: Downstream
    def __init__(self, turn: _Optional[int] = ..., step: _Optional[int] = ..., provider: _Optional[str] = ..., policy_key: _Optional[str] = ..., mode: _Optional[_Union[_policy_pb2.Mode, str]] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ..., reason: _Optional[_Union[DelegateReason, str]] = ..., detail: _Optional[str] = ..., downstream: _Optional[_Union[Downstream, str]] = ...) -> None: ...

class RetryStarted(_message.Message):
    __slots__ = ("retry_id", "turn", "step", "retry_number", "started_at", "traceparent")
    RETRY_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    RETRY_NUMBER_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    retry_id: str
    turn: int
    step: int
    retry_number: int
    started_at: _timestamp_pb2.Timestamp
    traceparent: str
    def __init__(self, retry_id: _Optional[str] = ..., turn: _Optional[int] = ..., step: _Optional[int] = ..., retry_number: _Optional[int] = ..., started_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., traceparent: _Optional[str] = ...) -> None: ...

class RetryCancelled(_message.Message):
    __slots__ = ("retry_id", "reason", "turn", "step", "retry_number")
    RETRY_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    RETRY_NUMBER_FIELD_NUMBER: _ClassVar[int]
    retry_id: str
    reason: CancelReason
    turn: int
    step: int
    retry_number: int
    def __init__(self, retry_id: _Optional[str] = ..., reason: _Optional[_Union[CancelReason, str]] = ..., turn: _Optional[int] = ..., step: _Optional[int] = ..., retry_number: _Optional[int] = ...) -> None: ...

class ChainClosed(_message.Message):
    __slots__ = ("provider", "policy_key", "reason", "retries")
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    POLICY_KEY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    provider: str
    policy_key: str
    reason: CloseReason
    retries: int
    def __init__(self, provider: _Optional[str] = ..., policy_key: _Optional[str] = ..., reason: _Optional[_Union[CloseReason, str]] = ..., retries: _Optional[int] = ...) -> None: ...
