"""The numbering of the model calls the middleware sees: a call's session,
turn and first step (Turn), the harness's own numbering (TurnFunc) and the
session a block names (session())."""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

@dataclass(frozen=True)
class Turn:
    """Where a model call sits in the agent's history: its session, its turn
    and the step of its first attempt (each retry is the next step)."""

    session_id: str
    turn: int
    first_step: int = 1
    logical_turn_id: str = ""


#: The harness's own numbering: the Turn of a model call, from its request
#: (an httpx or httpx2 Request).
TurnFunc = Callable[[Any], Turn]

_session: "contextvars.ContextVar[Optional[str]]" = contextvars.ContextVar("retryd_session", default=None)


@contextlib.contextmanager
def session(session_id: str) -> Iterator[None]:
    """Names the agent session of the model calls made inside the block (in
    this thread or task), for the default numbering."""
    token = _session.set(session_id)
    try:
        yield
    finally:
        _session.reset(token)
