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
import decimal
import os
import pathlib
import random
import secrets
import threading
from typing import Any

import pytest
import torch

import eager_modes
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
    assert "forward calls listdir, library code that may answer from files, the system or settings no key holds" in report
    LOG.clear()


@pytest.mark.parametrize("answer", [
    "__import__('math').floor(__import__('statistics').mean([1, 2, 3]))",
    # round 8: builtins, io and threading are bounded name by name; these names still are
    "(len(sorted([3, 1])), __import__('io').StringIO('ab').read(), type(__import__('threading').Lock()).__name__)",
    # the environment is a guarded read, not a library's answer (os is not bounded)
    "int(os.environ.get('MINIHOP_UNSET_FLAG', '1'))"])
def test_a_function_of_pure_libraries_is_not_single_use(answer: str) -> None:
    """``math``, ``statistics``, ``len``, ``io.StringIO``, ``threading.Lock``: bounded, the
    capture is reused."""
    fn = _logging(answer)
    minihop.reset()
    call = minihop.function(fn)
    for _ in range(3):
        call(torch.ones(2, requires_grad=True))
    assert minihop.counters()["captures"] == 1 and minihop.counters()["cache_hits"] == 2
    LOG.clear()


# -- round 8, from outside: answers from files, the thread and the decimal context -------------
# Each was baked in by the capture (strict and apply mode) before: ``open`` is a builtin (the
# builtins were bounded whole), ``pathlib.Path`` a class (a library class was bounded whatever its
# library), ``decimal``'s arithmetic answers from the thread's context, ``threading.current_thread``
# from the running thread (builtins, io and threading are now bounded name by name:
# ``tracer/library.ONLY``). And read by backward, a file changed before ``.backward()`` (backward is
# traced again when it runs: its reads are unknown).

def _read_file(path: pathlib.Path) -> float:
    with open(path) as fh:
        return float(fh.read())


class ReadsWithOpen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, path):
        return x * _read_file(path)

    @staticmethod
    def backward(ctx, g):
        return g, None


class ReadsWithPathlib(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, path):
        ctx.path = path
        return x * float(pathlib.Path(path).read_text())

    @staticmethod
    def backward(ctx, g):
        return g * float(pathlib.Path(ctx.path).read_text()), None


class DecimalThird(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * float(decimal.Decimal(1) / decimal.Decimal(3))

    @staticmethod
    def backward(ctx, g):
        return g


class ThreadNamed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * len(threading.current_thread().name)

    @staticmethod
    def backward(ctx, g):
        return g


@pytest.mark.parametrize("fn", [ReadsWithOpen, ReadsWithPathlib], ids=["open", "pathlib"])
def test_a_file_read_in_forward_and_backward(fn, tmp_path) -> None:
    path = tmp_path / "scale.txt"

    def write(v):
        path.write_text(str(v))

    write(2.0)
    eager_modes.matches_eager(fn, lambda i: (torch.linspace(-1, 1, 4).requires_grad_(), str(path)),
                              between=lambda i: write(2.0 + i), mid=lambda i: write(7.0 + i),
                              reset=lambda: write(2.0))


def test_decimal_context_precision_between_calls() -> None:
    context = decimal.getcontext()
    precision = context.prec
    try:
        eager_modes.matches_eager(DecimalThird, lambda i: (torch.linspace(-1, 1, 4).requires_grad_(),),
                                  between=lambda i: setattr(context, "prec", 3 + i),
                                  reset=lambda: setattr(context, "prec", precision))
    finally:
        context.prec = precision


def test_current_thread_name_between_calls() -> None:
    thread = threading.current_thread()
    name = thread.name
    try:
        eager_modes.matches_eager(ThreadNamed, lambda i: (torch.linspace(-1, 1, 4).requires_grad_(),),
                                  between=lambda i: setattr(thread, "name", "T" * (i + 1)),
                                  reset=lambda: setattr(thread, "name", name))
    finally:
        thread.name = name
