"""Reading a provider's answer for the failures that hide in a 200: an
empty completion, and a server-sent-event stream watched event by event
(held back until its first event with content; its error events, its stop
and its terminal event), for OpenAI-compatible and Anthropic responses."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

def empty_completion(data: bytes) -> bool:
    """Whether a non-streamed completion has nothing in it: every
    OpenAI-compatible choice stopped with no content, refusal or tool call,
    or an Anthropic message ended its turn with no content."""
    try:
        doc = json.loads(data)
    except ValueError:
        return False
    if not isinstance(doc, dict):
        return False
    if doc.get("type") == "message":
        return doc.get("stop_reason") == "end_turn" and not doc.get("content")
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    for ch in choices:
        if not isinstance(ch, dict):
            return False
        m = ch.get("message") or {}
        if ch.get("finish_reason") != "stop" or m.get("content") or m.get("refusal") or m.get("tool_calls"):
            return False
    return True


class SSE:
    """The state of a watched server-sent-event stream: the events held back
    until the first with content, and what the stream said so far."""

    def __init__(self) -> None:
        self.shown = False
        self.held: List[bytes] = []
        self.event = ""
        self.data: List[bytes] = []
        self.stopped = False  # a stop without content was seen
        self.done = False  # the terminal event ([DONE], message_stop) was seen
        self.partial = b""

    def lines(self, chunk: bytes) -> List[bytes]:
        buf = self.partial + chunk
        parts = buf.split(b"\n")
        self.partial = parts.pop()
        return [p + b"\n" for p in parts]

    def feed(self, line: bytes) -> Tuple[bytes, Optional[bytes]]:
        """Takes one line; returns the bytes the SDK may read now and, at the
        end of an error event, its data."""
        was_shown = self.shown
        if was_shown:
            out = line
        else:
            self.held.append(line)
            out = b""
        err = None
        s = line.rstrip(b"\r\n")
        if s == b"":
            err = self._dispatch()
        elif s.startswith(b"event:"):
            self.event = s[6:].strip().decode("utf-8", "replace")
        elif s.startswith(b"data:"):
            d = s[5:]
            self.data.append(d[1:] if d.startswith(b" ") else d)
        if not was_shown and self.shown:
            out = self.flush()
        return out, err

    def end(self) -> List[bytes]:
        """The lines that complete a stream that ended without its last
        line break or blank line."""
        out = []
        if self.partial:
            out.append(self.partial + b"\n")
            self.partial = b""
        if out or self.data:
            out.append(b"\n")
        return out

    def flush(self) -> bytes:
        out = b"".join(self.held)
        self.held = []
        return out

    def _dispatch(self) -> Optional[bytes]:
        event, data = self.event, b"\n".join(self.data)
        self.event, self.data = "", []
        if not data:
            return None
        if data.strip() == b"[DONE]" or event == "message_stop":
            self.done = True
            return None
        doc: Any = None
        try:
            doc = json.loads(data)
        except ValueError:
            pass
        if event == "error" or (isinstance(doc, dict) and isinstance(doc.get("error"), dict)):
            return data
        if not self.shown and isinstance(doc, dict):
            if _has_content(doc):
                self.shown = True
            elif _stops(doc):
                self.stopped = True
        return None


def _has_content(doc: Dict[str, Any]) -> bool:
    if doc.get("type") == "content_block_delta":
        return True
    for ch in doc.get("choices") or ():
        d = ch.get("delta") if isinstance(ch, dict) else None
        if isinstance(d, dict) and (d.get("content") or d.get("refusal") or d.get("tool_calls")):
            return True
    return False


def _stops(doc: Dict[str, Any]) -> bool:
    if doc.get("type") == "message_delta":
        delta = doc.get("delta")
        return isinstance(delta, dict) and delta.get("stop_reason") == "end_turn"
    return any(isinstance(ch, dict) and ch.get("finish_reason") == "stop" for ch in doc.get("choices") or ())


def is_sse(response: Any) -> bool:
    return str(response.headers.get("content-type", "")).split(";")[0].strip().lower() == "text/event-stream"
