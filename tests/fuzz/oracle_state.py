"""Run one Python-state ``Case`` (``generate_state.py``) against eager and minihop, and say what happened.

Shared by ``tests/fuzz/test_fuzz_python_state.py`` and ``bench/fuzz.py --generator
python-state``. The case's module is loaded afresh for each run, so eager and each minihop
run start from the same Python state (their own class, globals, closure cells, ``CFG``,
``LOG``). Each run follows the case's ``STEPS``: ``set_value(forward_value)``, call,
``set_value(backward_value)``, ``.backward()``; after each forward and each backward it records
the outputs, every tensor argument's ``.grad``, ``read_state()`` and what was printed.

Data-dependent cases (``generate_data.py``, through ``run_data_case``) use the same protocol:
``set_value(call)`` selects the call whose data ``make_args()`` returns, ``read_state()`` is
empty, the loss is scaled by the case's ``loss_weight()`` (so grads change sign between calls),
and tensors are compared exactly.

Two minihop runs:
  strict    ``minihop.apply(Fuzz, ...)``: must give eager's record, or raise a ``MinihopError``
            with a code documented in ``docs/unsupported.md`` (a refusal, code recorded).
  fallback  ``minihop.function(Fuzz, fallback="eager")``: must give eager's record, always.

Verdicts (``oracle.Outcome``):
  matched     both runs gave eager's record.
  refused     strict raised a documented code and fallback matched; but a refusal naming
              ``print`` when the only print is an untaken ``if DEBUG:`` branch is a mismatch
              (such a Function must capture).
  mismatched  a run's record differs from eager's: the signature names the run, what differs
              first (output, grad, state after forward/backward, printed text) and whether the
              value had changed between calls or before backward.
  crashed     any other exception, an undocumented code, MH301/MH401, or any exception from
              the fallback run.
  invalid     eager itself fails: the generator's fault.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import pathlib
import warnings
from collections.abc import Callable
from typing import Any

import torch

import minihop

from generate import Case, load_case_namespace
from oracle import _NOT_REFUSALS, DOCUMENTED_CODES, Outcome, _detail, _signature, write_case

__all__ = ["run_data_case", "run_state_case"]



class _RunMismatch(AssertionError):
    """A minihop run's record differs from eager's."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category


class _Step:
    """What one call of the protocol showed (compared field by field with eager's)."""

    def __init__(self, fwd_value: float, bwd_value: float) -> None:
        self.fwd_value, self.bwd_value = fwd_value, bwd_value
        self.outputs: list[torch.Tensor] = []
        self.grads: list[torch.Tensor | None] = []
        self.state_after_forward: Any = None
        self.state_after_backward: Any = None
        self.printed_after_forward = ""
        self.printed_after_backward = ""


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _run(case: Case, path: pathlib.Path, make_call: Callable[[type], Callable[..., Any]]) -> list[_Step]:
    """The case's STEPS on a fresh load of its module, calling through ``make_call(Fuzz)``."""
    namespace = load_case_namespace(case.source, str(path))
    try:
        return _steps(namespace, make_call)
    finally:
        # What the case changed of the process (a library binding, the default dtype, a hook
        # for every module) is put back: the next run, and the next test, start clean.
        namespace.get("restore_process", lambda: None)()


def _steps(namespace: dict[str, Any], make_call: Callable[[type], Callable[..., Any]]) -> list[_Step]:
    call = make_call(namespace["Fuzz"])
    printed = io.StringIO()
    steps = []
    for fwd_value, bwd_value in namespace["STEPS"]:
        step = _Step(fwd_value, bwd_value)
        namespace["set_value"](fwd_value)
        args = namespace["make_args"]()
        with contextlib.redirect_stdout(printed):
            out = call(*args)
        step.outputs = [t.detach().clone() for t in _tensors(out)]
        step.state_after_forward = namespace["read_state"]()
        for name in namespace.get("OUTPUT_ATTRIBUTES", ()):
            step.state_after_forward[f"output.{name}"] = namespace["plain"](getattr(out, name, None))
        step.printed_after_forward = printed.getvalue()
        namespace["set_value"](bwd_value)
        loss = sum(((t * (1.5 + i)).sum() for i, t in enumerate(_tensors(out)) if t.requires_grad),
                   torch.zeros(()))
        if "loss_weight" in namespace:  # a data-dependent case: the grad's sign changes per call
            loss = loss * namespace["loss_weight"]()
        with contextlib.redirect_stdout(printed):
            if loss.requires_grad:
                loss.backward()
        step.grads = [None if t.grad is None else t.grad.clone() for t in _tensors(args)]
        step.state_after_backward = namespace["read_state"]()
        step.printed_after_backward = printed.getvalue()
        steps.append(step)
    return steps


def _when(steps: list[_Step], i: int, backward: bool, reads: bool) -> str:
    """Which call, and whether the value read had changed (only for a case that reads one)."""
    step = steps[i]
    if not reads:
        return f"call {i + 1}"
    changed = [] if i == 0 or steps[i - 1].fwd_value == step.fwd_value else ["value changed between calls"]
    if backward and step.bwd_value != step.fwd_value:
        changed.append("value changed before backward")
    return f"call {i + 1}" + (f", {' and '.join(changed)}" if changed else "")


def _compare(eager: list[_Step], mine: list[_Step], reads: bool, exact: bool) -> None:
    """Raise ``_RunMismatch`` at the first difference (category: what differs and when);
    ``exact``: tensors equal bit for bit (rtol=0, atol=0), else ``assert_close``'s tolerance."""
    tolerance = {"rtol": 0.0, "atol": 0.0} if exact else {}
    for i, (e, m) in enumerate(zip(eager, mine, strict=True)):
        if len(e.outputs) != len(m.outputs):
            raise _RunMismatch("output structure", f"{_when(eager, i, False, reads)}: output count differs")
        for j, (te, tm) in enumerate(zip(e.outputs, m.outputs, strict=True)):
            try:
                torch.testing.assert_close(tm, te, equal_nan=True, **tolerance)
            except AssertionError as error:
                raise _RunMismatch(f"output ({_when(eager, i, False, reads)})",
                                   f"{_when(eager, i, False, reads)}, output {j}: {error}") from None
        if e.state_after_forward != m.state_after_forward:
            raise _RunMismatch(f"state after forward ({_when(eager, i, False, reads)})",
                               f"{_when(eager, i, False, reads)}: state after forward: eager "
                               f"{e.state_after_forward}, minihop {m.state_after_forward}")
        if e.printed_after_forward != m.printed_after_forward:
            raise _RunMismatch("printed text after forward",
                               f"{_when(eager, i, False, reads)}: printed after forward: eager "
                               f"{e.printed_after_forward!r}, minihop {m.printed_after_forward!r}")
        for j, (ge, gm) in enumerate(zip(e.grads, m.grads, strict=True)):
            if (ge is None) != (gm is None):
                raise _RunMismatch(f"grad ({_when(eager, i, True, reads)})",
                                   f"{_when(eager, i, True, reads)}, grad of args[{j}]: eager {ge}, minihop {gm}")
            if ge is not None:
                try:
                    torch.testing.assert_close(gm, ge, equal_nan=True, **tolerance)
                except AssertionError as error:
                    raise _RunMismatch(f"grad ({_when(eager, i, True, reads)})",
                                       f"{_when(eager, i, True, reads)}, grad of args[{j}]: {error}") from None
        if e.state_after_backward != m.state_after_backward:
            raise _RunMismatch(f"state after backward ({_when(eager, i, True, reads)})",
                               f"{_when(eager, i, True, reads)}: state after backward: eager "
                               f"{e.state_after_backward}, minihop {m.state_after_backward}")
        if e.printed_after_backward != m.printed_after_backward:
            raise _RunMismatch("printed text after backward",
                               f"{_when(eager, i, True, reads)}: printed after backward: eager "
                               f"{e.printed_after_backward!r}, minihop {m.printed_after_backward!r}")


def _strict(fn_cls: type) -> Callable[..., Any]:
    return lambda *args: minihop.apply(fn_cls, *args)


def _fallback(fn_cls: type) -> Callable[..., Any]:
    return minihop.function(fn_cls, fallback="eager").apply


def _eager(fn_cls: type) -> Callable[..., Any]:
    return fn_cls.apply


def _verdict(case: Case, name: str, eager: list[_Step], path: pathlib.Path,
             make_call: Callable[[type], Callable[..., Any]], exact: bool) -> Outcome:
    """One minihop run against eager's record."""
    try:
        _compare(eager, _run(case, path, make_call), any(f.startswith("read-") for f in case.features),
                 exact)
    except _RunMismatch as error:
        return Outcome("mismatched", "", f"{name}: {error.category}", _detail(error), error)
    except minihop.MinihopError as error:
        if name == "fallback":
            return Outcome("crashed", error.code, f"fallback raised {error.code} " + _signature(error),
                           _detail(error), error)
        if error.code in _NOT_REFUSALS:
            return Outcome("crashed", error.code, f"{error.code} ({_NOT_REFUSALS[error.code]}) "
                           + _signature(error), _detail(error), error)
        if error.code not in DOCUMENTED_CODES:
            return Outcome("crashed", error.code, f"undocumented {error.code} " + _signature(error),
                           _detail(error), error)
        if "print" in str(error) and "write-print" not in case.features:
            # Only an untaken ``if DEBUG: print(...)``: no side effect happens in eager.
            return Outcome("mismatched", error.code, f"strict: refused an untaken `if DEBUG: print(...)` "
                           f"({error.code})", _detail(error), error)
        return Outcome("refused", error.code, f"{error.code} {_signature(error)}", _detail(error), error)
    except Exception as error:  # noqa: BLE001 - any other exception is a minihop crash
        return Outcome("crashed", "", f"{name}: " + _signature(error), _detail(error), error)
    return Outcome("matched")


def run_state_case(case: Case, directory: pathlib.Path, *, exact: bool = False) -> Outcome:
    """Eager first (an eager failure makes the case invalid), then strict and fallback.

    The verdict is the worse of the two runs (crashed, mismatched, refused, matched; strict's
    on a tie); the other run's verdict is appended to the detail.
    """
    path = write_case(case, directory)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            eager = _run(case, path, _eager)
        except Exception as error:  # noqa: BLE001 - the generator's fault, reported as such
            return Outcome("invalid", type(error).__name__, _signature(error), _detail(error), error)
        strict = _verdict(case, "strict", eager, path, _strict, exact)
        fallback = _verdict(case, "fallback", eager, path, _fallback, exact)
    rank = {"crashed": 0, "mismatched": 1, "refused": 2, "matched": 3}
    worse, other = (strict, fallback) if rank[strict.kind] <= rank[fallback.kind] else (fallback, strict)
    if worse.kind == "matched":
        return worse
    note = f"\n(the other run: {other.kind}{': ' + other.signature if other.signature else ''})\n"
    return dataclasses.replace(worse, detail=worse.detail + note)


def run_data_case(case: Case, directory: pathlib.Path) -> Outcome:
    """A data-dependent case (``generate_data.py``): the same protocol, tensors compared exactly
    (a value guard that served a stale capture could be off by one ulp)."""
    return run_state_case(case, directory, exact=True)
