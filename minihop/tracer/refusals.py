"""Which exceptions are the tracing machinery's, and minihop's coded refusal for each.

Place in the pipeline: tracer, asked wherever the user's code runs on fake values (each op in
``recorder.RecordingMode``, each phase in ``trace``, whole functions in ``program``): an
exception is either eager's or the user's (it reaches the caller unchanged) or one only fake
tensors and torch's tracing machinery raise (it becomes a ``MinihopError`` saying what to do).

Invariant: ``refusal_for`` is the one place where torch-internal exception types are turned
into minihop's; it never converts the user's own exception, eager's, or minihop's.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorDeviceMismatchError,
    UnsupportedOperatorException,
)
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from ..errors import DataDependentError, MinihopError, UnsupportedArgumentError, UnsupportedOperationError
from .frames import TORCH_DIR

__all__ = ["FAKE_ONLY_DATA", "fake_data_missing", "refusal_for", "unrecorded_tensor", "unrouted_read"]

_DATA_DEPENDENT = (DataDependentOutputException, DynamicOutputShapeException,
                   GuardOnDataDependentSymNode)
# Where torch's tracing machinery defines its exceptions: these and every ``torch._*`` module
# but ``torch._C`` (which holds eager's own, such as ``torch.linalg.LinAlgError``). None of
# them is eager's or the user's to catch.
_INTERNAL_MODULES = ("torch.fx", "torch.utils._sympy", "sympy")
# Built-in exceptions that only fake tensors or symbolic sizes raise (eager runs the same
# call): (type, part of the message).
FAKE_ONLY_DATA = ((RuntimeError, "its data is not allocated yet"),)
_NO_FAKE_KERNEL = ((RuntimeError, "fake impl"), (RuntimeError, "fake kernel"))
_FAKE_ONLY = (*_NO_FAKE_KERNEL,
              (RuntimeError, "with symbolic sizes/strides"),
              (RuntimeError, "size_bytes_is_heap_allocated_"),
              (TypeError, "unhashable type: non-nested SymInt"),
              # torch's C++ invariants, tripped by fake tensors (torch.distributions' validation
              # of a masked_select result): never what eager raises.
              (RuntimeError, "INTERNAL ASSERT FAILED"),
              (AssertionError, "Please convert all Tensors to FakeTensors first"))


def _matches(error: BaseException, table: tuple[tuple[type, str], ...]) -> bool:
    return any(type(error) is kind and text in str(error) for kind, text in table)


def fake_data_missing(error: BaseException) -> bool:
    """Whether ``error`` is a fake tensor's, raised for lack of data eager would have."""
    return _matches(error, FAKE_ONLY_DATA)


def _is_internal(error: BaseException) -> bool:
    module = type(error).__module__ or ""
    if type(error) is AssertionError:
        # An assertion inside torch's private packages (its tracing machinery's invariants);
        # not torch._assert, which is the user's own assertion (torch/__init__.py).
        frames = traceback.extract_tb(error.__traceback__)
        if not frames:
            return False
        parts = os.path.relpath(frames[-1].filename, TORCH_DIR).split(os.sep)
        return len(parts) > 1 and (parts[0].startswith("_") or parts[0] == "fx"
                                   or (parts[0] == "utils" and parts[1].startswith("_")))
    if module.startswith("torch._"):
        return not (module == "torch._C" or module.startswith("torch._C."))
    return any(module == m or module.startswith(m + ".") for m in _INTERNAL_MODULES)



def refusal_for(error: BaseException, describe: str, op: Any | None,
                where: str | None) -> MinihopError | None:
    """minihop's coded refusal for an exception that fake tensors or torch's tracing machinery
    raised while ``describe`` (``"F.backward"``) ran ``op``; None for any other exception
    (the user's own, eager's own, minihop's), which must reach the caller unchanged.

    The one place where torch-internal exception types are turned into minihop's.
    """
    if issubclass(type(error), MinihopError):
        return None
    message = str(error)
    internal = _is_internal(error)
    fake_only = _matches(error, _FAKE_ONLY)
    fake_data = fake_data_missing(error)
    if not (internal or fake_only or fake_data):
        return None
    if issubclass(type(op), (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        name: str | None = str(op)  # namespace.op.overload: the name the user registered
    else:
        name = getattr(op, "__name__", None) or (str(op) if op is not None else None)
    calls = f"calls {name}" if name else "runs code"
    first = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    if issubclass(type(error), _DATA_DEPENDENT) or fake_data:
        return DataDependentError(
            f"{describe} {calls}, whose result depends on tensor values.",
            "minihop traces on fake tensors that have shapes and dtypes but no values, so "
            "Python control flow or numbers taken from tensor data (.item(), .tolist(), "
            "bool(t), torch.tensor of a tensor's elements, data-dependent output shapes) cannot "
            "be captured.",
            "Compute with tensor ops instead (torch.where, masks), or pass the number as a "
            "Python argument; or run this Function eagerly.",
            where=where)
    if issubclass(type(error), UnsupportedOperatorException) or _matches(error, _NO_FAKE_KERNEL):
        return UnsupportedOperationError(
            f"{describe} {calls}, which has no fake-tensor implementation.",
            "minihop must run every op on fake tensors to learn output shapes.",
            "Register a fake (meta) kernel for the op, or run this Function eagerly.",
            where=where)
    if issubclass(type(error), FakeTensorDeviceMismatchError):
        return UnsupportedOperationError(
            f"{describe} {calls} on tensors on different devices.\n  found: {first}",
            "Eager fails on this call too (a RuntimeError: tensors on two devices, or a device "
            "torch was not built for); minihop finds it while tracing, on fake tensors.",
            "Create the tensors on the device of the inputs (torch.tensor(v, device=x.device)), "
            "or move them with .to(x.device).",
            where=where)
    subject = f"{describe} calls {name}, which fails" if name else f"{describe} fails"
    kind = (f"torch's internal {type(error).__name__}" if internal
            else f"a {type(error).__name__} that only fake tensors raise")
    return UnsupportedOperationError(
        f"{subject} on minihop's fake tensors with {kind}.\n  found: {first}",
        "minihop runs forward and backward on fake tensors; this error comes from that "
        "machinery, not from the call eager would make.",
        "Run this Function eagerly (minihop.function(F, fallback='eager')), or rewrite the "
        "call with ops that work on fake tensors.",
        where=where)


def unrecorded_tensor(function: str, value: Any, fake_mode: Any, where: str | None) -> MinihopError:
    """The refusal for a tensor the trace uses that no op it recorded made and no input is."""
    if getattr(value, "fake_mode", None) is fake_mode:
        # Made by this trace's fake mode, out of the recorder's sight: a torch call that skips
        # torch function modes (``torch.range``, the legacy constructors ``torch.Tensor(4)``,
        # ``torch.FloatTensor(n)``).
        return UnsupportedOperationError(
            f"{function} uses a tensor made by a torch call that minihop's recorder does not see.",
            "A few torch calls skip torch function modes (torch.range, and the legacy "
            "constructors torch.Tensor(n), torch.FloatTensor(...), torch.LongTensor(...)): the "
            "tensor they make has no op in the graph, so the graph could not make it again.",
            "Make it with torch.arange, torch.tensor(...) or torch.empty(...), or run the "
            "Function eagerly with minihop.function(F, fallback='eager').", where=where)
    return UnsupportedArgumentError(
        f"{function} used a fake tensor that minihop did not create.",
        "Fake tensors from another capture or FakeTensorMode cannot be mixed in.",
        "Pass real tensors to minihop.capture.", where=where)


def unrouted_read(function: str, cut: bool) -> MinihopError:
    """Backward reads a tensor held outside its arguments that no route reaches (``cut``: the
    walk from its globals and closure cells stopped short)."""
    return UnsupportedOperationError(
        f"{function}.backward reads a tensor held outside its arguments that minihop cannot find "
        "again when backward runs" + (" (the walk from its globals and closure cells stopped: too "
                                      "deep or too many containers)." if cut else
                                      " (reached through an object minihop does not walk)."),
        "Eager's backward reads it when it runs: replacing it between forward and .backward() "
        "changes what backward computes, and a capture could only use the tensor forward saw.",
        "Save it in forward (ctx.save_for_backward) or pass it as an argument, or run the "
        "Function eagerly with minihop.function(F, fallback='eager').")
