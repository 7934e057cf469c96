from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODE_UNSPECIFIED: _ClassVar[Mode]
    MODE_NORMAL: _ClassVar[Mode]
    MODE_ALWAYS: _ClassVar[Mode]
    MODE_SCHEDULE: _ClassVar[Mode]

class Jitter(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JITTER_UNSPECIFIED: _ClassVar[Jitter]
    JITTER_SYMMETRIC: _ClassVar[Jitter]
    JITTER_FULL: _ClassVar[Jitter]

class RetryAfterOverCap(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RETRY_AFTER_OVER_CAP_UNSPECIFIED: _ClassVar[RetryAfterOverCap]
    RETRY_AFTER_OVER_CAP_DELEGATE: _ClassVar[RetryAfterOverCap]
    RETRY_AFTER_OVER_CAP_LOCAL: _ClassVar[RetryAfterOverCap]
    RETRY_AFTER_OVER_CAP_HONOR: _ClassVar[RetryAfterOverCap]
MODE_UNSPECIFIED: Mode
MODE_NORMAL: Mode
MODE_ALWAYS: Mode
MODE_SCHEDULE: Mode
JITTER_UNSPECIFIED: Jitter
JITTER_SYMMETRIC: Jitter
JITTER_FULL: Jitter
RETRY_AFTER_OVER_CAP_UNSPECIFIED: RetryAfterOverCap
RETRY_AFTER_OVER_CAP_DELEGATE: RetryAfterOverCap
RETRY_AFTER_OVER_CAP_LOCAL: RetryAfterOverCap
RETRY_AFTER_OVER_CAP_HONOR: RetryAfterOverCap

class RetryPolicy(_message.Message):
    __slots__ = ("mode", "max_retries", "retryable_codes", "backoff", "schedule", "tail_delay_ms", "retry_after_over_cap", "min_attempt_ms")
    MODE_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_CODES_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    TAIL_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_OVER_CAP_FIELD_NUMBER: _ClassVar[int]
    MIN_ATTEMPT_MS_FIELD_NUMBER: _ClassVar[int]
    mode: Mode
    max_retries: int
    retryable_codes: _containers.RepeatedScalarFieldContainer[str]
    backoff: Backoff
    schedule: _containers.RepeatedScalarFieldContainer[int]
    tail_delay_ms: int
    retry_after_over_cap: RetryAfterOverCap
    min_attempt_ms: int
    def __init__(self, mode: _Optional[_Union[Mode, str]] = ..., max_retries: _Optional[int] = ..., retryable_codes: _Optional[_Iterable[str]] = ..., backoff: _Optional[_Union[Backoff, _Mapping]] = ..., schedule: _Optional[_Iterable[int]] = ..., tail_delay_ms: _Optional[int] = ..., retry_after_over_cap: _Optional[_Union[RetryAfterOverCap, str]] = ..., min_attempt_ms: _Optional[int] = ...) -> None: ...

class Backoff(_message.Message):
    __slots__ = ("initial_delay_ms", "max_delay_ms", "multiplier", "jitter_ratio", "jitter")
    INITIAL_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    JITTER_RATIO_FIELD_NUMBER: _ClassVar[int]
    JITTER_FIELD_NUMBER: _ClassVar[int]
    initial_delay_ms: int
    max_delay_ms: int
    multiplier: float
    jitter_ratio: float
    jitter: Jitter
    def __init__(self, initial_delay_ms: _Optional[int] = ..., max_delay_ms: _Optional[int] = ..., multiplier: _Optional[float] = ..., jitter_ratio: _Optional[float] = ..., jitter: _Optional[_Union[Jitter, str]] = ...) -> None: ...
