"""The Dynamo sweep: every Function the suite checks against eager is also checked against Dynamo.

A pytest plugin (registered by ``conftest.py``). While the suite runs, every call of
``minihop.testing.assert_matches_eager`` (by that name, from any test module or helper) goes
through ``checked``: once the eager comparison passes, minihop's ``fwd_body_0``/``bwd_body_0``
for that Function and those arguments are compared with ``torch.compile(fullgraph=True)``'s,
strictly (``assert_same_graph(..., check_meta=True)``: node kinds, targets, operand order,
constants, shapes and dtypes). A difference fails the test that made the call, unless the
Function is in ``KNOWN_DIFFERENCES``, which mirrors docs/oracle.md's "Where minihop's words still
differ from Dynamo's" (``test_dynamo_sweep.py`` checks the two agree); a listed Function that starts
to agree fails too, so the list cannot go stale.

What is not compared, deliberately:
- Functions Dynamo does not capture as one ``autograd_function_apply`` (a graph break, an
  unsupported construct, no input needing a grad so Dynamo inlines forward): counted as "not
  one HOP" and listed in the summary; the acceptance (docs/oracle.md) is about the others.
- Dynamic-shape captures (``dynamic=...`` or marked tensors): their size nodes are compared by
  ``test_automatic_dynamic.py`` and ``test_oracle.py``, with their own known differences.
- Calls inside functorch transforms or off the main thread: Dynamo would trace the wrappers,
  or race another thread's compile.
- The fuzz suite's generated Functions (calls from ``tests/fuzz``): hundreds of fresh random
  classes a run, each a compile (minutes on this suite's budget); they stay eager-parity checks.

Side effects: ``dynamo_graphs`` never runs the compiled code, so a Function's Python side
effects (counters, globals, lists it appends to), which Dynamo replays after its graph, do not
happen again; the arguments are cloned before the test's own call and Dynamo sees the clones;
nothing is reset, so tests that use ``torch.compile`` themselves keep their caches. Each
Function class and argument signature is compiled once per run.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import fx

import minihop.testing
from minihop.structure import iter_leaves

_BACKWARD_READ = "A tensor backward reads from a global, a closure cell or an attribute"
# Function (module:qualname) -> the docs/oracle.md bullet (its bold title) that explains the difference.
KNOWN_DIFFERENCES: dict[str, str] = {
    "test_capture_cases:TestOps.test_conv1d_with_nn_grad.<locals>.Conv":
        "Python-level helpers without `__torch_function__`",
    "test_dynamo_words:two_names": "Two names for one tensor after an in-place method",
    "test_dynamo_words:dunder_by_name": "An operator's dunder called by name",
    "no_source_file:NoSource": "Code without a source file",
    "test_dynamo_words:property_in_backward": "A tensor property of a saved input, read in backward",
    "test_hostile:TestValues.test_empty_matmul_and_mean.<locals>.EmptyOps":
        "A tensor property of a saved input, read in backward",
    "test_dynamo_words:integer_argument": "A gradient returned for an integer argument",
    "test_hostile:TestValues.test_integer_argument_given_a_gradient.<locals>.IntArg":
        "A gradient returned for an integer argument",
    "test_range_checks:SizeOfSelected": "`.shape` of a tensor whose size comes from the data",
    "test_capture_cases:TestInputs.test_closure_tensor.<locals>.Closure": _BACKWARD_READ,
    "test_capture_cases:TestInputs.test_module_attribute_tensor.<locals>.UseLinear": _BACKWARD_READ,
    "test_capture_cases:TestInputs.test_module_argument.<locals>.Apply": _BACKWARD_READ,
    "test_capture_cases:TestOps.test_grad_mode_off_in_bodies.<locals>.Check":
        "Grad mode read where backward was entered",
}

# Calls from files in these test directories are not swept (see the module docstring).
_NOT_SWEPT_DIRECTORIES = ("fuzz",)


def function_key(fn_cls: type) -> str:
    """How ``KNOWN_DIFFERENCES`` names a Function: ``module:qualname``."""
    return f"{fn_cls.__module__}:{fn_cls.__qualname__}"


@dataclasses.dataclass
class Tally:
    """What the sweep saw this run, by Function key."""

    agree: set[str] = dataclasses.field(default_factory=set)
    known: set[str] = dataclasses.field(default_factory=set)
    differ: set[str] = dataclasses.field(default_factory=set)
    stale: set[str] = dataclasses.field(default_factory=set)  # listed, yet agrees
    not_one_hop: dict[str, str] = dataclasses.field(default_factory=dict)
    skipped: set[str] = dataclasses.field(default_factory=set)
    seconds: float = 0.0  # spent in Dynamo and the comparison: the sweep's cost to the suite


TALLY = Tally()


def _signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """What a capture depends on: each tensor's properties, every other leaf's type and value."""
    parts: list[Any] = []
    for path, leaf in iter_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor):
            parts.append((path, tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.device,
                          leaf.requires_grad, leaf._is_view()))
        else:
            parts.append((path, type(leaf), repr(leaf)[:200]))
    return tuple(parts)


def _is_dynamic(cap: Any) -> bool:
    for gm in (cap.fwd, cap.bwd):
        for node in gm.graph.nodes:
            val = node.meta.get("val")
            if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return True
            if isinstance(val, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in val.shape):
                return True
    return False


def _skip_reason(fn_cls: type, kwargs: dict[str, Any]) -> str | None:
    if kwargs.get("dynamic"):
        return "dynamic shapes"
    if torch._C._are_functorch_transforms_active():
        return "inside a functorch transform"
    if threading.current_thread() is not threading.main_thread():
        return "off the main thread"
    return None


def _one_hop(outer: fx.GraphModule) -> bool:
    calls = [n for n in outer.graph.nodes if n.op == "call_function"
             and getattr(n.target, "__name__", "") == "autograd_function_apply"]
    return len(calls) == 1


def compare(fn_cls: type, cap: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
            known: dict[str, str] = KNOWN_DIFFERENCES, tally: Tally = TALLY) -> str | None:
    """Compare ``cap``'s bodies with Dynamo's for ``fn_cls.apply(*args, **kwargs)``.

    Returns the failure message (an unlisted difference, or a listed one that is gone), or
    None; records the outcome in ``tally``.
    """
    key = function_key(fn_cls)
    try:
        dg = minihop.testing.dynamo_graphs(fn_cls, *args, **kwargs)
    except Exception as e:  # a graph break or an unsupported construct: not one HOP
        tally.not_one_hop[key] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
        return None
    if not _one_hop(dg.outer):
        tally.not_one_hop[key] = "more than one autograd_function_apply"
        return None
    diffs = []
    for body, mine, theirs in (("fwd_body_0", cap.fwd, dg.fwd), ("bwd_body_0", cap.bwd, dg.bwd)):
        try:
            minihop.testing.assert_same_graph(mine, theirs, check_meta=True)
        except AssertionError as e:
            diffs.append(f"{body} (a: minihop, b: Dynamo) {e}")
    if not diffs:
        if key in known:
            tally.stale.add(key)
            return (f"Dynamo sweep: {key} now agrees with torch.compile(fullgraph=True)'s bodies, but "
                    f"it is a known difference ({known[key]!r}).\nRemove it from KNOWN_DIFFERENCES "
                    "in tests/dynamo_sweep.py, and its docs/oracle.md line if no other Function needs it.")
        tally.agree.add(key)
        return None
    if key in known:
        tally.known.add(key)
        return None
    tally.differ.add(key)
    return (f"Dynamo sweep: minihop's bodies for {key} differ from torch.compile(fullgraph=True)'s "
            "(outputs and grads matched eager).\n" + "\n".join(diffs) +
            "\nMake minihop record what Dynamo records; or, if Dynamo's graph is not the right one "
            "for eager parity, list the difference with its reason in docs/oracle.md's \"Where minihop's "
            "words still differ from Dynamo's\" and in KNOWN_DIFFERENCES (tests/dynamo_sweep.py).")


def checked(original: Callable[..., Any], known: dict[str, str] = KNOWN_DIFFERENCES,
            tally: Tally = TALLY) -> Callable[..., Any]:
    """``assert_matches_eager`` that also compares the capture's bodies with Dynamo's."""
    # (Function, argument signature) -> the failure, or None: each is compiled once per run.
    # The Function is held weakly, so the sweep keeps no test's class (or its closure) alive.
    seen_before: dict[tuple[Any, tuple[Any, ...]], str | None] = {}

    @functools.wraps(original)
    def assert_matches_eager(fn_cls: type, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # the failure is the test's call, not this wrapper
        caller = sys._getframe(1).f_globals.get("__file__") or ""
        if pathlib.Path(caller).parent.name in _NOT_SWEPT_DIRECTORIES:
            return original(fn_cls, *args, **kwargs)
        snapshot = minihop.testing.clone_args(args)  # before the test's call can touch them
        capture_kwargs = {k: v for k, v in kwargs.items() if k not in ("rtol", "atol", "backward", "seed")}
        kw_snapshot = dict(zip(capture_kwargs, minihop.testing.clone_args(tuple(capture_kwargs.values())),
                               strict=True))
        result = original(fn_cls, *args, **kwargs)
        reason = _skip_reason(fn_cls, capture_kwargs) or ("dynamic shapes" if _is_dynamic(result.capture) else None)
        if reason is not None:
            tally.skipped.add(function_key(fn_cls))
            return result
        try:
            seen = (weakref.ref(fn_cls), _signature(snapshot, kw_snapshot))
            hash(seen)
        except TypeError:  # an argument that cannot be a key: compare every call
            seen = None
        if seen is not None and seen in seen_before:
            failure = seen_before[seen]
        else:
            call_kwargs = {k: v for k, v in kw_snapshot.items() if k != "dynamic"}
            start = time.perf_counter()
            failure = compare(fn_cls, result.capture, snapshot, call_kwargs, known, tally)
            tally.seconds += time.perf_counter() - start
            if seen is not None:
                seen_before[seen] = failure
        if failure is not None:
            raise AssertionError(failure)
        return result

    return assert_matches_eager


class SweepPlugin:
    """Installs ``checked`` wherever ``assert_matches_eager`` is bound; prints the tally."""

    def __init__(self) -> None:
        self.original = minihop.testing.assert_matches_eager
        self.wrapped = checked(self.original)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # Test modules and their helpers have imported the name by now; minihop.testing's own
        # binding serves any later import.
        for module in list(sys.modules.values()):
            # The module's own dict: a lazy module's __getattr__ is not asked.
            if getattr(module, "__dict__", {}).get("assert_matches_eager") is self.original:
                module.assert_matches_eager = self.wrapped  # type: ignore[union-attr]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        t = TALLY
        if not (t.agree or t.known or t.differ or t.stale or t.not_one_hop):
            return
        terminalreporter.write_sep("-", "Dynamo sweep (tests/dynamo_sweep.py)")
        terminalreporter.write_line(
            f"{len(t.agree)} Functions agree strictly with torch.compile(fullgraph=True), "
            f"{len(t.known)} are listed differences (docs/oracle.md), {len(t.differ)} differ unexplained, "
            f"{len(t.not_one_hop)} are not one HOP in Dynamo, {len(t.skipped)} skipped "
            f"(dynamic shapes, transforms, threads); {t.seconds:.0f} s in Dynamo and the comparisons")
        for key, why in sorted(t.not_one_hop.items()):
            terminalreporter.write_line(f"  not one HOP: {key}: {why}")
        for key in sorted(t.differ):
            terminalreporter.write_line(f"  differs: {key}")
        for key in sorted(t.stale):
            terminalreporter.write_line(f"  listed but agrees: {key}")
