"""A logger read by a Function is keyed by what code can take from it: whether it logs.

A module-level logger (``LOG = logging.getLogger(__name__)``) read in forward or backward was
keyed through all its attributes, its manager and so every logger of the process: each backward
key took over a second in a test process (``tests/test_backward_standing.py`` took 70 s). Now
its identity, effective level, ``disabled`` flag and the process-wide ``logging.disable``
level; a Function branching on ``LOG.isEnabledFor(...)`` still sees the caller's level change
(eager's branch).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

import eager_modes

LOG = logging.getLogger("minihop.tests.logger_keys")


class LogsWhenDebugging(torch.autograd.Function):
    """Forward and backward compute an extra term only while the logger is at DEBUG."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * (3.0 if LOG.isEnabledFor(logging.DEBUG) else 2.0)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * (5.0 if LOG.isEnabledFor(logging.DEBUG) else 2.0)


def test_logger_level_changed_between_calls_and_before_backward_matches_eager() -> None:
    eager_modes.matches_eager(
        LogsWhenDebugging, lambda i: (torch.arange(1.0, 4.0).requires_grad_(),), steps=5,
        between=lambda i: LOG.setLevel(logging.DEBUG if i in (1, 3) else logging.WARNING),
        mid=lambda i: LOG.setLevel(logging.DEBUG if i == 2 else LOG.level),
        reset=lambda: LOG.setLevel(logging.WARNING))


def test_logging_disable_between_calls_and_before_backward_matches_eager() -> None:
    """``logging.disable(logging.DEBUG)`` (process-wide, the loggers' manager's) switches
    ``isEnabledFor`` without touching the logger: it was left out of the key (round 8)."""
    LOG.setLevel(logging.DEBUG)
    try:
        eager_modes.matches_eager(
            LogsWhenDebugging, lambda i: (torch.arange(1.0, 4.0).requires_grad_(),), steps=5,
            between=lambda i: logging.disable(logging.DEBUG if i in (1, 3) else logging.NOTSET),
            mid=lambda i: logging.disable(logging.DEBUG if i == 2 else logging.root.manager.disable),
            reset=lambda: logging.disable(logging.NOTSET))
    finally:
        logging.disable(logging.NOTSET)
        LOG.setLevel(logging.WARNING)
