from google.protobuf import timestamp_pb2 as _timestamp_pb2
from retryd.v1 import events_pb2 as _events_pb2
from retryd.v1 import policy_pb2 as _policy_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

CIRCUIT_STATE_CLOSED: CircuitState
CIRCUIT_STATE_HALF_OPEN: CircuitState
CIRCUIT_STATE_OPEN: CircuitState
CIRCUIT_STATE_UNSPECIFIED: CircuitState
DESCRIPTOR: _descriptor.FileDescriptor
RETRY_STATUS_CANCELLED: RetryStatus
RETRY_STATUS_PENDING: RetryStatus
RETRY_STATUS_STARTED: RetryStatus
RETRY_STATUS_UNSPECIFIED: RetryStatus

class AwaitRetryRequest(_message.Message):
    __slots__ = ["retry_id"]
    RETRY_ID_FIELD_NUMBER: _ClassVar[int]
    retry_id: str
    def __init__(self, retry_id: _Optional[str] = ...) -> None: ...

class AwaitRetryResponse(_message.Message):
    __slots__ = ["cancelled", "started", "state"]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    cancelled: _events_pb2.RetryCancelled
    started: _events_pb2.RetryStarted
    state: RetryState
    def __init__(self, state: _Optional[_Union[RetryState, _Mapping]] = ..., started: _Optional[_Union[_events_pb2.RetryStarted, _Mapping]] = ..., cancelled: _Optional[_Union[_events_pb2.RetryCancelled, _Mapping]] = ...) -> None: ...

class CancelRetriesRequest(_message.Message):
    __slots__ = ["retry_id", "session_id"]
    RETRY_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    retry_id: str
    session_id: str
    def __init__(self, retry_id: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class CancelRetriesResponse(_message.Message):
    __slots__ = ["delegations_cancelled", "retries"]
    DELEGATIONS_CANCELLED_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    delegations_cancelled: int
    retries: _containers.RepeatedCompositeFieldContainer[RetryState]
    def __init__(self, retries: _Optional[_Iterable[_Union[RetryState, _Mapping]]] = ..., delegations_cancelled: _Optional[int] = ...) -> None: ...

class Chain(_message.Message):
    __slots__ = ["latest", "max_retries", "mode", "open", "policy_key", "provider", "retries", "updated_at"]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    POLICY_KEY_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    latest: RetryState
    max_retries: int
    mode: _policy_pb2.Mode
    open: bool
    policy_key: str
    provider: str
    retries: int
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, provider: _Optional[str] = ..., policy_key: _Optional[str] = ..., mode: _Optional[_Union[_policy_pb2.Mode, str]] = ..., retries: _Optional[int] = ..., max_retries: _Optional[int] = ..., open: bool = ..., latest: _Optional[_Union[RetryState, _Mapping]] = ..., updated_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ["delegate", "schedule"]
    DELEGATE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    delegate: Delegate
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., delegate: _Optional[_Union[Delegate, _Mapping]] = ...) -> None: ...

class Delegate(_message.Message):
    __slots__ = ["detail", "reason"]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    detail: str
    reason: _events_pb2.DelegateReason
    def __init__(self, reason: _Optional[_Union[_events_pb2.DelegateReason, str]] = ..., detail: _Optional[str] = ...) -> None: ...

class FailedStepRequest(_message.Message):
    __slots__ = ["deadline", "downstream", "failure", "logical_turn_id", "policy", "policy_name", "provider", "replay", "session_id", "step", "turn"]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    DOWNSTREAM_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    LOGICAL_TURN_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    POLICY_NAME_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    deadline: _timestamp_pb2.Timestamp
    downstream: _events_pb2.Downstream
    failure: _events_pb2.Failure
    logical_turn_id: str
    policy: _policy_pb2.RetryPolicy
    policy_name: str
    provider: str
    replay: _events_pb2.Replay
    session_id: str
    step: int
    turn: int
    def __init__(self, session_id: _Optional[str] = ..., turn: _Optional[int] = ..., step: _Optional[int] = ..., logical_turn_id: _Optional[str] = ..., provider: _Optional[str] = ..., policy: _Optional[_Union[_policy_pb2.RetryPolicy, _Mapping]] = ..., policy_name: _Optional[str] = ..., failure: _Optional[_Union[_events_pb2.Failure, _Mapping]] = ..., downstream: _Optional[_Union[_events_pb2.Downstream, str]] = ..., deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., replay: _Optional[_Union[_events_pb2.Replay, str]] = ...) -> None: ...

class FailedStepResponse(_message.Message):
    __slots__ = ["decision", "event"]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    decision: Decision
    event: _events_pb2.Event
    def __init__(self, decision: _Optional[_Union[Decision, _Mapping]] = ..., event: _Optional[_Union[_events_pb2.Event, _Mapping]] = ...) -> None: ...

class GetChainsRequest(_message.Message):
    __slots__ = ["session_id"]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class GetChainsResponse(_message.Message):
    __slots__ = ["chains", "step", "turn"]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    chains: _containers.RepeatedCompositeFieldContainer[Chain]
    step: int
    turn: int
    def __init__(self, chains: _Optional[_Iterable[_Union[Chain, _Mapping]]] = ..., turn: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...

class GetProviderStateRequest(_message.Message):
    __slots__ = ["provider"]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    provider: str
    def __init__(self, provider: _Optional[str] = ...) -> None: ...

class GetProviderStateResponse(_message.Message):
    __slots__ = ["budget_capacity", "budget_tokens", "circuit", "earliest_start", "failure_rate", "open_until", "protected", "provider", "queued_retries", "window_samples"]
    BUDGET_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    BUDGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CIRCUIT_FIELD_NUMBER: _ClassVar[int]
    EARLIEST_START_FIELD_NUMBER: _ClassVar[int]
    FAILURE_RATE_FIELD_NUMBER: _ClassVar[int]
    OPEN_UNTIL_FIELD_NUMBER: _ClassVar[int]
    PROTECTED_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    QUEUED_RETRIES_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    budget_capacity: float
    budget_tokens: float
    circuit: CircuitState
    earliest_start: _timestamp_pb2.Timestamp
    failure_rate: float
    open_until: _timestamp_pb2.Timestamp
    protected: bool
    provider: str
    queued_retries: int
    window_samples: int
    def __init__(self, provider: _Optional[str] = ..., protected: bool = ..., budget_tokens: _Optional[float] = ..., budget_capacity: _Optional[float] = ..., failure_rate: _Optional[float] = ..., window_samples: _Optional[int] = ..., circuit: _Optional[_Union[CircuitState, str]] = ..., open_until: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., earliest_start: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., queued_retries: _Optional[int] = ...) -> None: ...

class RetryState(_message.Message):
    __slots__ = ["awaiters", "cancelled", "retry_id", "scheduled", "session_id", "started", "status"]
    AWAITERS_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    RETRY_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    awaiters: int
    cancelled: _events_pb2.RetryCancelled
    retry_id: str
    scheduled: _events_pb2.RetryScheduled
    session_id: str
    started: _events_pb2.RetryStarted
    status: RetryStatus
    def __init__(self, retry_id: _Optional[str] = ..., session_id: _Optional[str] = ..., status: _Optional[_Union[RetryStatus, str]] = ..., scheduled: _Optional[_Union[_events_pb2.RetryScheduled, _Mapping]] = ..., started: _Optional[_Union[_events_pb2.RetryStarted, _Mapping]] = ..., cancelled: _Optional[_Union[_events_pb2.RetryCancelled, _Mapping]] = ..., awaiters: _Optional[int] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ["delay_ms", "delay_source", "detail", "due_at", "max_retries", "mode", "policy_key", "retry_id", "retry_number"]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    DELAY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    DUE_AT_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    POLICY_KEY_FIELD_NUMBER: _ClassVar[int]
    RETRY_ID_FIELD_NUMBER: _ClassVar[int]
    RETRY_NUMBER_FIELD_NUMBER: _ClassVar[int]
    delay_ms: int
    delay_source: _events_pb2.DelaySource
    detail: str
    due_at: _timestamp_pb2.Timestamp
    max_retries: int
    mode: _policy_pb2.Mode
    policy_key: str
    retry_id: str
    retry_number: int
    def __init__(self, retry_id: _Optional[str] = ..., retry_number: _Optional[int] = ..., max_retries: _Optional[int] = ..., delay_ms: _Optional[int] = ..., delay_source: _Optional[_Union[_events_pb2.DelaySource, str]] = ..., due_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., policy_key: _Optional[str] = ..., mode: _Optional[_Union[_policy_pb2.Mode, str]] = ..., detail: _Optional[str] = ...) -> None: ...

class StepSucceededRequest(_message.Message):
    __slots__ = ["provider", "session_id", "step", "turn"]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    provider: str
    session_id: str
    step: int
    turn: int
    def __init__(self, session_id: _Optional[str] = ..., turn: _Optional[int] = ..., step: _Optional[int] = ..., provider: _Optional[str] = ...) -> None: ...

class StepSucceededResponse(_message.Message):
    __slots__ = ["closed"]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    closed: _containers.RepeatedCompositeFieldContainer[_events_pb2.ChainClosed]
    def __init__(self, closed: _Optional[_Iterable[_Union[_events_pb2.ChainClosed, _Mapping]]] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ["after_sequence", "session_id", "stop_at_end"]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STOP_AT_END_FIELD_NUMBER: _ClassVar[int]
    after_sequence: int
    session_id: str
    stop_at_end: bool
    def __init__(self, session_id: _Optional[str] = ..., after_sequence: _Optional[int] = ..., stop_at_end: bool = ...) -> None: ...

class WatchEventsResponse(_message.Message):
    __slots__ = ["event"]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: _events_pb2.Event
    def __init__(self, event: _Optional[_Union[_events_pb2.Event, _Mapping]] = ...) -> None: ...

class RetryStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class CircuitState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
