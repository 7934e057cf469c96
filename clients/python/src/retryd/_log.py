"""The client's logger, ``logging.getLogger("retryd")``: degraded-mode
transitions (WARNING when no replica answers and the client decides
locally, INFO when retryd answers again), retries the client starts by
itself (WARNING), AwaitRetry re-attaches (INFO), and retryd's refusals
(INFO while the client sends a refused call again after the delay retryd
asked for, WARNING when it raises the refusal). The library adds no
handler; configure logging in the application."""

from __future__ import annotations

import logging

log = logging.getLogger("retryd")
