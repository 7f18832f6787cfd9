"""Torch's own log lines, silenced while minihop traces.

Place in the pipeline: tracer (``trace.trace_function`` runs every trace inside
``quiet_torch_logs``). Fake tensors and the ShapeEnv log at error level when an op fails on
them (``failed while attempting to run meta for aten._is_all_true.default``), though the
failure is minihop's to handle: the trace either goes on, or is refused with a coded
``MinihopError`` (and ``fallback="eager"`` then runs the Function). Either way the caller
asked for no torch log line, and eager prints none.

Invariant: only loggers of the ``torch`` package are touched, only for the trace's duration,
and each is put back as it was (the user's own loggers, inside forward, still log).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

__all__ = ["quiet_torch_logs"]


@contextlib.contextmanager
def quiet_torch_logs() -> Iterator[None]:
    """Disable every ``torch`` logger for the duration (restored after, even on error)."""
    loggers = [logging.getLogger("torch")]
    loggers += [lg for name, lg in list(logging.root.manager.loggerDict.items())
                if name.startswith("torch.") and issubclass(type(lg), logging.Logger)]
    was = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        yield
    finally:
        for lg, disabled in zip(loggers, was, strict=True):
            lg.disabled = disabled
