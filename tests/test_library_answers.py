"""Library functions that answer from files, the system or the network, called by forward:
``secrets.token_hex``, ``random.SystemRandom().random()``, ``os.listdir``, ``socket.gethostname``,
``datetime.datetime.now()`` (a builtin method: its module is its class's), ``secrets.randbits``
(a method of the ``SystemRandom`` object ``secrets`` keeps: a method answers from its object).

A capture bakes in what the call answered while tracing; eager calls it again on every call.
Such a library is not among those whose answers minihop bounds (``tracer/library.py``'s
``BOUNDED``: torch, Python's pure modules, and those whose objects the heap watch sees), so the
capture is single-use: right for the call it was traced for, captured again (strict) or run
eagerly (fallback) for the next. Before, ``secrets.token_hex`` and ``SystemRandom`` gave every
call the trace's answer (appended to a log on each call), silent in both modes.
"""

from __future__ import annotations

import datetime
import os
import random
import secrets
from typing import Any

import pytest
import torch

import minihop

LOG: list[Any] = []

def _logging(answer: str) -> type:
    ns: dict[str, Any] = {"torch": torch, "LOG": LOG, "secrets": secrets, "random": random, "os": os,
                          "datetime": datetime}
    exec(f"""
class F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        LOG.append({answer})
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2
""", ns)
    return ns["F"]


@pytest.mark.parametrize("fallback", ["raise", "eager"])
@pytest.mark.parametrize("answer", ["secrets.token_hex(4)", "random.SystemRandom().random()",
                                    # found from outside in round 6 (each baked in before, both modes):
                                    # a builtin method with no module of its own, and a method
                                    # of a SystemRandom object the library keeps
                                    "datetime.datetime.now().isoformat()", "secrets.randbits(64)",
                                    "secrets.choice(list(range(10 ** 6)))"])
def test_an_answer_from_the_system_is_new_on_every_call(answer: str, fallback: str) -> None:
    fn = _logging(answer)
    LOG.clear()
    call = minihop.function(fn, fallback=fallback)
    for _ in range(3):
        call(torch.ones(2, requires_grad=True)).sum().backward()
    assert len(LOG) == 3 and len(set(map(str, LOG))) == 3, LOG  # eager's: three answers


def test_explain_names_the_library_call_that_makes_a_capture_single_use() -> None:
    fn = _logging("len(os.listdir('.'))")
    report = str(minihop.explain(fn, torch.ones(2, requires_grad=True), print_report=False))
    assert "forward calls listdir, library code that may answer from files, the system or the network" in report
    LOG.clear()


def test_a_function_of_pure_libraries_is_not_single_use() -> None:
    """``math``, ``statistics``, ``collections``: bounded, the capture is reused."""
    fn = _logging("__import__('math').floor(__import__('statistics').mean([1, 2, 3]))")
    minihop.reset()
    call = minihop.function(fn)
    for _ in range(3):
        call(torch.ones(2, requires_grad=True))
    assert minihop.counters()["captures"] == 1 and minihop.counters()["cache_hits"] == 2
    LOG.clear()
