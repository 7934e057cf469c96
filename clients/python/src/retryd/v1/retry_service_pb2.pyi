from google.protobuf import timestamp_pb2 as _timestamp_pb2
from retryd.v1 import events_pb2 as _events_pb2
from retryd.v1 import policy_pb2 as _policy_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RetryStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RETRY_STATUS_UNSPECIFIED: _ClassVar[RetryStatus]
    RETRY_STATUS_PENDING: _ClassVar[RetryStatus]
    RETRY_STATUS_STARTED: _ClassVar[RetryStatus]
    RETRY_STATUS_CANCELLED: _ClassVar[RetryStatus]

class CircuitState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CIRCUIT_STATE_UNSPECIFIED: _ClassVar[CircuitState]
    CIRCUIT_STATE_CLOSED: _ClassVar[CircuitState]
    CIRCUIT_STATE_OPEN: _ClassVar[CircuitState]
    CIRCUIT_STATE_HALF_OPEN: _ClassVar[CircuitState]
RETRY_STATUS_UNSPECIFIED: RetryStatus
RETRY_STATUS_PENDING: RetryStatus
RETRY_STATUS_STARTED: RetryStatus
RETRY_STATUS_CANCELLED: RetryStatus
CIRCUIT_STATE_UNSPECIFIED: CircuitState
CIRCUIT_STATE_CLOSED: CircuitState
CIRCUIT_STATE_OPEN: CircuitState
CIRCUIT_STATE_HALF_OPEN: CircuitState

class FailedStepRequest(_message.Message):
    __slots__ = ("session_id", "turn", "step", "logical_turn_id", "provider", "policy", "policy_name", "failure", "downstream", "deadline", "replay")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    LOGICAL_TURN_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    POLICY_NAME_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    DOWNSTREAM_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    turn: int
    step: int
    logical_turn_id: str
    provider: str
    policy: _policy_pb2.RetryPolicy
    policy_name: str
    failure: _events_pb2.Failure
    downstream: _events_pb2.Downstream
    deadline: _timestamp_pb2.Timestamp
    replay: _events_pb2.Replay
    def __init__(self, session_id: _Optional[str] = ..., turn: _Optional[int] = ..., step: _Optional[int] = ..., logical_turn_id: _Optional[str] = ..., provider: _Optional[str] = ..., policy: _Optional[_Union[_policy_pb2.RetryPolicy, _Mapping]] = ..., policy_name: _Optional[str] = ..., failure: _Optional[_Union[_events_pb2.Failure, _Mapping]] = ..., downstream: _Optional[_Union[_events_pb2.Downstream, str]] = ..., deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., replay: _Optional[_Union[_events_pb2.Replay, str]] = ...) -> None: ...

class FailedStepResponse(_message.Message):
    __slots__ = ("decision", "event")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    decision: Decision
    event: _events_pb2.Event
    def __init__(self, decision: _Optional[_Union[Decision, _Mapping]] = ..., event: _Optional[_Union[_events_pb2.Event, _Mapping]] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("schedule", "delegate")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    DELEGATE_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    delegate: Delegate
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., delegate: _Optional[_Union[Delegate, _Mapping]] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ("retry_id", "retry_number", "max_retries", "delay_ms", "delay_source", "due_at", "policy_key", "mode", "detail")
    RETRY_ID_FIELD_NUMBER: _ClassVar[int]
    RETRY_NUMBER_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    DELAY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    DUE_AT_FIELD_NUMBER: _ClassVar[int]
    POLICY_KEY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    retry_id: str
    retry_number: int
    max_retries: int
    delay_ms: int
    delay_source: _events_pb2.DelaySource
    due_at: _timestamp_pb2.Timestamp
    policy_key: str
    mode: _policy_pb2.Mode
    detail: str
    def __init__(self, retry_id: _Optional[str] = ..., retry_number: _Optional[int] = ..., max_retries: _Optional[int] = ..., delay_ms: _Optional[int] = ..., delay_source: _Optional[_Union[_events_pb2.DelaySource, str]] = ..., due_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., policy_key: _Optional[str] = ..., mode: _Optional[_Union[_policy_pb2.Mode, str]] = ..., detail: _Optional[str] = ...) -> None: ...

class Delegate(_message.Message):
    __slots__ = ("reason", "detail")
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    reason: _events_pb2.DelegateReason
    detail: str
    def __init__(self, reason: _Optional[_Union[_events_pb2.DelegateReason, str]] = ..., detail: _Optional[str] = ...) -> None: ...

class AwaitRetryRequest(_message.Message):
    __slots__ = ("retry_id",)
    RETRY_ID_FIELD_NUMBER: _ClassVar[int]
    retry_id: str
    def __init__(self, retry_id: _Optional[str] = ...) -> None: ...

class AwaitRetryResponse(_message.Message):
    __slots__ = ("state", "started", "cancelled")
    STATE_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    state: RetryState
    started: _events_pb2.RetryStarted
    cancelled: _events_pb2.RetryCancelled
    def __init__(self, state: _Optional[_Union[RetryState, _Mapping]] = ..., started: _Optional[_Union[_events_pb2.RetryStarted, _Mapping]] = ..., cancelled: _Optional[_Union[_events_pb2.RetryCancelled, _Mapping]] = ...) -> None: ...

class RetryState(_message.Message):
    __slots__ = ("retry_id", "session_id", "status", "scheduled", "started", "cancelled", "awaiters")
    RETRY_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    AWAITERS_FIELD_NUMBER: _ClassVar[int]
    retry_id: str
    session_id: str
    status: RetryStatus
    scheduled: _events_pb2.RetryScheduled
    started: _events_pb2.RetryStarted
    cancelled: _events_pb2.RetryCancelled
    awaiters: int
    def __init__(self, retry_id: _Optional[str] = ..., session_id: _Optional[str] = ..., status: _Optional[_Union[RetryStatus, str]] = ..., scheduled: _Optional[_Union[_events_pb2.RetryScheduled, _Mapping]] = ..., started: _Optional[_Union[_events_pb2.RetryStarted, _Mapping]] = ..., cancelled: _Optional[_Union[_events_pb2.RetryCancelled, _Mapping]] = ..., awaiters: _Optional[int] = ...) -> None: ...

class CancelRetriesRequest(_message.Message):
    __slots__ = ("retry_id", "session_id")
    RETRY_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    retry_id: str
    session_id: str
    def __init__(self, retry_id: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class CancelRetriesResponse(_message.Message):
    __slots__ = ("retries", "delegations_cancelled")
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    DELEGATIONS_CANCELLED_FIELD_NUMBER: _ClassVar[int]
    retries: _containers.RepeatedCompositeFieldContainer[RetryState]
    delegations_cancelled: int
    def __init__(self, retries: _Optional[_Iterable[_Union[RetryState, _Mapping]]] = ..., delegations_cancelled: _Optional[int] = ...) -> None: ...

class StepSucceededRequest(_message.Message):
    __slots__ = ("session_id", "turn", "step", "provider")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    turn: int
    step: int
    provider: str
    def __init__(self, session_id: _Optional[str] = ..., turn: _Optional[int] = ..., step: _Optional[int] = ..., provider: _Optional[str] = ...) -> None: ...

class StepSucceededResponse(_message.Message):
    __slots__ = ("closed",)
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    closed: _containers.RepeatedCompositeFieldContainer[_events_pb2.ChainClosed]
    def __init__(self, closed: _Optional[_Iterable[_Union[_events_pb2.ChainClosed, _Mapping]]] = ...) -> None: ...

class GetChainsRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class GetChainsResponse(_message.Message):
    __slots__ = ("chains", "turn", "step")
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    chains: _containers.RepeatedCompositeFieldContainer[Chain]
    turn: int
    step: int
    def __init__(self, chains: _Optional[_Iterable[_Union[Chain, _Mapping]]] = ..., turn: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...

class Chain(_message.Message):
    __slots__ = ("provider", "policy_key", "mode", "retries", "max_retries", "open", "latest", "updated_at")
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    POLICY_KEY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    provider: str
    policy_key: str
    mode: _policy_pb2.Mode
    retries: int
    max_retries: int
    open: bool
    latest: RetryState
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, provider: _Optional[str] = ..., policy_key: _Optional[str] = ..., mode: _Optional[_Union[_policy_pb2.Mode, str]] = ..., retries: _Optional[int] = ..., max_retries: _Optional[int] = ..., open: bool = ..., latest: _Optional[_Union[RetryState, _Mapping]] = ..., updated_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("session_id", "after_sequence", "stop_at_end")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    STOP_AT_END_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    after_sequence: int
    stop_at_end: bool
    def __init__(self, session_id: _Optional[str] = ..., after_sequence: _Optional[int] = ..., stop_at_end: bool = ...) -> None: ...

class WatchEventsResponse(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: _events_pb2.Event
    def __init__(self, event: _Optional[_Union[_events_pb2.Event, _Mapping]] = ...) -> None: ...

class GetProviderStateRequest(_message.Message):
    __slots__ = ("provider",)
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    provider: str
    def __init__(self, provider: _Optional[str] = ...) -> None: ...

class GetProviderStateResponse(_message.Message):
    __slots__ = ("provider", "protected", "budget_tokens", "budget_capacity", "failure_rate", "window_samples", "circuit", "open_until", "earliest_start", "queued_retries")
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    PROTECTED_FIELD_NUMBER: _ClassVar[int]
    BUDGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    FAILURE_RATE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    CIRCUIT_FIELD_NUMBER: _ClassVar[int]
    OPEN_UNTIL_FIELD_NUMBER: _ClassVar[int]
    EARLIEST_START_FIELD_NUMBER: _ClassVar[int]
    QUEUED_RETRIES_FIELD_NUMBER: _ClassVar[int]
    provider: str
    protected: bool
    budget_tokens: float
    budget_capacity: float
    failure_rate: float
    window_samples: int
    circuit: CircuitState
    open_until: _timestamp_pb2.Timestamp
    earliest_start: _timestamp_pb2.Timestamp
    queued_retries: int
    def __init__(self, provider: _Optional[str] = ..., protected: bool = ..., budget_tokens: _Optional[float] = ..., budget_capacity: _Optional[float] = ..., failure_rate: _Optional[float] = ..., window_samples: _Optional[int] = ..., circuit: _Optional[_Union[CircuitState, str]] = ..., open_until: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., earliest_start: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., queued_retries: _Optional[int] = ...) -> None: ...
