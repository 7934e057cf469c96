from google.protobuf import timestamp_pb2 as _timestamp_pb2
from retryd.v1 import policy_pb2 as _policy_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Mapping as _Mapping, Optional as _Optional, Union as _Union

CANCEL_REASON_ABANDONED: CancelReason
CANCEL_REASON_EXPIRED: CancelReason
CANCEL_REASON_REQUESTED: CancelReason
CANCEL_REASON_SHUTDOWN: CancelReason
CANCEL_REASON_UNSPECIFIED: CancelReason
CLOSE_REASON_CANCELLED: CloseReason
CLOSE_REASON_EXHAUSTED: CloseReason
CLOSE_REASON_EXPIRED: CloseReason
CLOSE_REASON_SUCCEEDED: CloseReason
CLOSE_REASON_UNSPECIFIED: CloseReason
DELAY_SOURCE_BACKOFF: DelaySource
DELAY_SOURCE_CIRCUIT_OPEN: DelaySource
DELAY_SOURCE_FLEET_BUDGET: DelaySource
DELAY_SOURCE_PROVIDER_PACING: DelaySource
DELAY_SOURCE_PROVIDER_RETRY_AFTER: DelaySource
DELAY_SOURCE_SCHEDULE: DelaySource
DELAY_SOURCE_TAIL: DelaySource
DELAY_SOURCE_UNSPECIFIED: DelaySource
DELEGATE_REASON_BUDGET_EXHAUSTED: DelegateReason
DELEGATE_REASON_CODE_NOT_RETRYABLE: DelegateReason
DELEGATE_REASON_DEADLINE: DelegateReason
DELEGATE_REASON_DOWNSTREAM_FIRST: DelegateReason
DELEGATE_REASON_DOWNSTREAM_HANDLED: DelegateReason
DELEGATE_REASON_FLEET_BUDGET_EXHAUSTED: DelegateReason
DELEGATE_REASON_FLEET_CIRCUIT_OPEN: DelegateReason
DELEGATE_REASON_NO_PROVIDER: DelegateReason
DELEGATE_REASON_REPLAY_UNSAFE: DelegateReason
DELEGATE_REASON_RETRY_AFTER_OVER_CAP: DelegateReason
DELEGATE_REASON_UNSPECIFIED: DelegateReason
DESCRIPTOR: _descriptor.FileDescriptor
DOWNSTREAM_DECLINED: Downstream
DOWNSTREAM_HANDLED: Downstream
DOWNSTREAM_NOT_ASKED: Downstream
DOWNSTREAM_UNSPECIFIED: Downstream
REPLAY_SAFE: Replay
REPLAY_UNSAFE: Replay
REPLAY_UNSPECIFIED: Replay

class ChainClosed(_message.Message):
    __slots__ = ["policy_key", "provider", "reason", "retries"]
    POLICY_KEY_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    policy_key: str
    provider: str
    reason: CloseReason
    retries: int
    def __init__(self, provider: _Optional[str] = ..., policy_key: _Optional[str] = ..., reason: _Optional[_Union[CloseReason, str]] = ..., retries: _Optional[int] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ["cancelled", "closed", "delegated", "scheduled", "sequence", "session_id", "started", "time"]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    DELEGATED_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    cancelled: RetryCancelled
    closed: ChainClosed
    delegated: RetryDelegated
    scheduled: RetryScheduled
    sequence: int
    session_id: str
    started: RetryStarted
    time: _timestamp_pb2.Timestamp
    def __init__(self, sequence: _Optional[int] = ..., session_id: _Optional[str] = ..., time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., scheduled: _Optional[_Union[RetryScheduled, _Mapping]] = ..., delegated: _Optional[_Union[RetryDelegated, _Mapping]] = ..., started: _Optional[_Union[RetryStarted, _Mapping]] = ..., cancelled: _Optional[_Union[RetryCancelled, _Mapping]] = ..., closed: _Optional[_Union[ChainClosed, _Mapping]] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ["code", "http_status", "message", "provider_retry_after_ms", "retry_after"]
    CODE_FIELD_NUMBER: _ClassVar[int]
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    code: str
    http_status: int
    message: str
    provider_retry_after_ms: int
    retry_after: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., http_status: _Optional[int] = ..., provider_retry_after_ms: _Optional[int] = ..., retry_after: _Optional[str] = ...) -> None: ...

class RetryCancelled(_message.Message):
    __slots__ = ["reason", "retry_id", "retry_number", "step", "turn"]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRY_ID_FIELD_NUMBER: _ClassVar[int]
    RETRY_NUMBER_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    reason: CancelReason
    retry_id: str
    retry_number: int
    step: int
    turn: int
    def __init__(self, retry_id: _Optional[str] = ..., reason: _Optional[_Union[CancelReason, str]] = ..., turn: _Optional[int] = ..., step: _Optional[int] = ..., retry_number: _Optional[int] = ...) -> None: ...

class RetryDelegated(_message.Message):
    __slots__ = ["detail", "downstream", "failure", "mode", "policy_key", "provider", "reason", "step", "turn"]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    DOWNSTREAM_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    POLICY_KEY_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    detail: str
    downstream: Downstream
    failure: Failure
    mode: _policy_pb2.Mode
    policy_key: str
    provider: str
    reason: DelegateReason
    step: int
    turn: int
    def __init__(self, turn: _Optional[int] = ..., step: _Optional[int] = ..., provider: _Optional[str] = ..., policy_key: _Optional[str] = ..., mode: _Optional[_Union[_policy_pb2.Mode, str]] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ..., reason: _Optional[_Union[DelegateReason, str]] = ..., detail: _Optional[str] = ..., downstream: _Optional[_Union[Downstream, str]] = ...) -> None: ...

class RetryScheduled(_message.Message):
    __slots__ = ["delay_ms", "delay_source", "detail", "due_at", "failure", "logical_turn_id", "max_retries", "mode", "policy", "policy_key", "provider", "retry_id", "retry_number", "step", "traceparent", "turn"]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    DELAY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    DUE_AT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    LOGICAL_TURN_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    POLICY_KEY_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    RETRY_ID_FIELD_NUMBER: _ClassVar[int]
    RETRY_NUMBER_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    delay_ms: int
    delay_source: DelaySource
    detail: str
    due_at: _timestamp_pb2.Timestamp
    failure: Failure
    logical_turn_id: str
    max_retries: int
    mode: _policy_pb2.Mode
    policy: _policy_pb2.RetryPolicy
    policy_key: str
    provider: str
    retry_id: str
    retry_number: int
    step: int
    traceparent: str
    turn: int
    def __init__(self, retry_id: _Optional[str] = ..., turn: _Optional[int] = ..., step: _Optional[int] = ..., logical_turn_id: _Optional[str] = ..., provider: _Optional[str] = ..., mode: _Optional[_Union[_policy_pb2.Mode, str]] = ..., policy_key: _Optional[str] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ..., retry_number: _Optional[int] = ..., max_retries: _Optional[int] = ..., delay_ms: _Optional[int] = ..., delay_source: _Optional[_Union[DelaySource, str]] = ..., due_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., policy: _Optional[_Union[_policy_pb2.RetryPolicy, _Mapping]] = ..., traceparent: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class RetryStarted(_message.Message):
    __slots__ = ["retry_id", "retry_number", "started_at", "step", "traceparent", "turn"]
    RETRY_ID_FIELD_NUMBER: _ClassVar[int]
    RETRY_NUMBER_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    retry_id: str
    retry_number: int
    started_at: _timestamp_pb2.Timestamp
    step: int
    traceparent: str
    turn: int
    def __init__(self, retry_id: _Optional[str] = ..., turn: _Optional[int] = ..., step: _Optional[int] = ..., retry_number: _Optional[int] = ..., started_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., traceparent: _Optional[str] = ...) -> None: ...

class DelaySource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class DelegateReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class CancelReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class CloseReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class Downstream(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class Replay(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
