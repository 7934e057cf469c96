from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
JITTER_FULL: Jitter
JITTER_SYMMETRIC: Jitter
JITTER_UNSPECIFIED: Jitter
MODE_ALWAYS: Mode
MODE_NORMAL: Mode
MODE_SCHEDULE: Mode
MODE_UNSPECIFIED: Mode
RETRY_AFTER_OVER_CAP_DELEGATE: RetryAfterOverCap
RETRY_AFTER_OVER_CAP_HONOR: RetryAfterOverCap
RETRY_AFTER_OVER_CAP_LOCAL: RetryAfterOverCap
RETRY_AFTER_OVER_CAP_UNSPECIFIED: RetryAfterOverCap

class Backoff(_message.Message):
    __slots__ = ["initial_delay_ms", "jitter", "jitter_ratio", "max_delay_ms", "multiplier"]
    INITIAL_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    JITTER_FIELD_NUMBER: _ClassVar[int]
    JITTER_RATIO_FIELD_NUMBER: _ClassVar[int]
    MAX_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    initial_delay_ms: int
    jitter: Jitter
    jitter_ratio: float
    max_delay_ms: int
    multiplier: float
    def __init__(self, initial_delay_ms: _Optional[int] = ..., max_delay_ms: _Optional[int] = ..., multiplier: _Optional[float] = ..., jitter_ratio: _Optional[float] = ..., jitter: _Optional[_Union[Jitter, str]] = ...) -> None: ...

class RetryPolicy(_message.Message):
    __slots__ = ["backoff", "max_retries", "min_attempt_ms", "mode", "retry_after_over_cap", "retryable_codes", "schedule", "tail_delay_ms"]
    BACKOFF_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    MIN_ATTEMPT_MS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_CODES_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_OVER_CAP_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    TAIL_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    backoff: Backoff
    max_retries: int
    min_attempt_ms: int
    mode: Mode
    retry_after_over_cap: RetryAfterOverCap
    retryable_codes: _containers.RepeatedScalarFieldContainer[str]
    schedule: _containers.RepeatedScalarFieldContainer[int]
    tail_delay_ms: int
    def __init__(self, mode: _Optional[_Union[Mode, str]] = ..., max_retries: _Optional[int] = ..., retryable_codes: _Optional[_Iterable[str]] = ..., backoff: _Optional[_Union[Backoff, _Mapping]] = ..., schedule: _Optional[_Iterable[int]] = ..., tail_delay_ms: _Optional[int] = ..., retry_after_over_cap: _Optional[_Union[RetryAfterOverCap, str]] = ..., min_attempt_ms: _Optional[int] = ...) -> None: ...

class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class Jitter(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class RetryAfterOverCap(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
