"""Run one ``generate_modes.py`` case against eager and minihop, and say what happened.

Shared by ``tests/fuzz/test_fuzz_modes.py`` and ``python -m bench fuzz --generator modes``.
The case's module is loaded afresh for each run (eager, strict ``minihop.function(Fuzz)``,
``minihop.function(Fuzz, fallback="eager")``), so each starts from the same Python state. A
run calls the Function once per entry of ``SIZES`` (sizes change: the automatic dynamic cache
makes them symbolic), under the case's ``MODE``, then its ``TRANSFORM``; it records, per call:

  - every output, as a plain structure with exact types (a ``torch.SymInt`` where eager gives
    an ``int`` is a mismatch, a tuple where eager gives a ``torch.Size`` too), tensors with
    dtype, shape, ``requires_grad``, ``is_inference()`` and values; ``y.info`` and whether it
    is a fresh object (not the previous call's);
  - the grads (``.grad`` of ``x`` and ``w``: after backward, twice with ``retain_graph``,
    or of the double backward with ``create_graph``), and the transform's result;
  - the Python state (``read_state()``).

Verdicts (``oracle.Outcome``): matched (both runs gave eager's record); refused (strict
raised a documented code, the fallback matched eager); mismatched (a silent difference: the
signature says which run and what differs first); crashed (any exception from a minihop run
that eager did not raise, an undocumented code, MH301/MH401, or any exception of the
fallback run); invalid (eager itself failed: the generator's fault).
"""

from __future__ import annotations

import contextlib
import pathlib
import warnings
from collections.abc import Callable
from typing import Any

import torch

import minihop

from generate import Case, load_case_namespace
from oracle import _NOT_REFUSALS, DOCUMENTED_CODES, Outcome, _detail, _signature, write_case

__all__ = ["run_modes_case"]

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


class _Mismatch(AssertionError):
    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category


def plain(value: Any, seen: set[int] | None = None) -> Any:
    """``value`` as comparable data, with its exact types."""
    if isinstance(value, _SYMBOLIC):
        return ("SYMBOLIC", type(value).__name__, str(value))
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), value.requires_grad, value.is_inference(),
                value.detach().clone())
    if isinstance(value, torch.Size):
        return ("Size", tuple(plain(v) for v in value))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(plain(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, plain(v)) for k, v in value.items()))
    return (type(value).__name__, value)


def _mode(mode: str) -> Any:
    if mode == "no_grad":
        return torch.no_grad()
    if mode == "inference_mode":
        return torch.inference_mode()
    if mode == "autocast":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _tensors(out: Any) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else [v for v in out if isinstance(v, torch.Tensor)]


def _first(out: Any) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out[0]


def _run(ns: dict[str, Any], call: Callable[..., Any]) -> list[dict[str, Any]]:
    """The case's protocol through ``call`` (``Fuzz.apply`` or a minihop entry)."""
    mode, transform = ns["MODE"], ns["TRANSFORM"]
    ns["reset_state"]()
    records = []
    info_before = None
    for i in range(len(ns["SIZES"])):
        rec: dict[str, Any] = {}
        needs_grad = mode not in ("no_grad", "inference_mode")
        with _mode(mode):
            x, w = ns["make_args"](i)
            if needs_grad:
                x.requires_grad_(True)
                w.requires_grad_(True)
            out = call(x, w)
        rec["out"] = plain(out)
        info = getattr(_first(out), "info", None)
        rec["info"] = plain(info)
        rec["info_fresh"] = info is None or info is not info_before
        info_before = info
        rec["state_after_forward"] = plain(ns["read_state"]())
        if needs_grad:
            weights = [1.5 + k for k in range(len(_tensors(out)))]
            loss = sum(((t.float() * c).sum() for t, c in zip(_tensors(out), weights, strict=True)
                        if t.requires_grad), torch.zeros(()))
            if mode == "create_graph" and loss.requires_grad:
                gx, gw = torch.autograd.grad(loss, (x, w), create_graph=True)
                rec["first_order"] = plain((gx, gw))
                (gx * gx).sum().add((gw * gw).sum()).backward()
            elif mode == "retain_graph" and loss.requires_grad:
                loss.backward(retain_graph=True)
                loss.backward()
            elif loss.requires_grad:
                loss.backward()
            rec["grads"] = plain((x.grad, w.grad))
        if transform != "none":
            rec["transform"] = plain(_transform(transform, call, ns["make_args"](i)))
        rec["state"] = plain(ns["read_state"]())
        records.append(rec)
    return records


def _transform(transform: str, call: Callable[..., Any], args: tuple[torch.Tensor, torch.Tensor]) -> Any:
    x, w = args
    if transform == "grad":
        return torch.func.grad(lambda w_: _first(call(x, w_)).sum())(w)
    if transform == "vjp":
        out, pull = torch.func.vjp(lambda x_, w_: _first(call(x_, w_)), x, w)
        return out, pull(torch.ones_like(out))
    if transform == "jacrev":
        return torch.func.jacrev(lambda w_: _first(call(x, w_)).sum(0))(w)
    return torch.func.vmap(lambda xb: _first(call(xb, w)), in_dims=0)(torch.stack([x, x * 2, -x]))


def _compare(eager: Any, mine: Any, where: str) -> None:
    if isinstance(eager, torch.Tensor) or isinstance(mine, torch.Tensor):
        if not (isinstance(eager, torch.Tensor) and isinstance(mine, torch.Tensor)):
            raise _Mismatch("value", f"{where}: eager {type(eager).__name__}, minihop {type(mine).__name__}")
        try:
            torch.testing.assert_close(mine, eager, equal_nan=True)
        except AssertionError as e:
            raise _Mismatch("value", f"{where}: {str(e).splitlines()[0]}") from None
        return
    if type(eager) is not type(mine):
        raise _Mismatch("type", f"{where}: eager {type(eager).__name__} {eager!r}, minihop {type(mine).__name__} {mine!r}")
    if isinstance(eager, (tuple, list)):
        if len(eager) != len(mine):
            raise _Mismatch("structure", f"{where}: eager {eager!r}, minihop {mine!r}")
        for k, (e, m) in enumerate(zip(eager, mine, strict=True)):
            _compare(e, m, f"{where}[{k}]")
        return
    if isinstance(eager, dict):
        if list(eager) != list(mine):
            raise _Mismatch("structure", f"{where}: keys eager {list(eager)}, minihop {list(mine)}")
        for k in eager:
            _compare(eager[k], mine[k], f"{where}.{k}")
        return
    if eager != mine:
        raise _Mismatch("value", f"{where}: eager {eager!r}, minihop {mine!r}")


def run_modes_case(case: Case, directory: pathlib.Path) -> Outcome:
    path = write_case(case, directory)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            eager_ns = load_case_namespace(case.source, str(path))
            eager = _run(eager_ns, eager_ns["Fuzz"].apply)
        except Exception as e:  # eager itself fails: the generator's fault
            return Outcome("invalid", signature=_signature(e), detail=_detail(e), error=e)
        outcome: Outcome | None = None
        for label, options in (("strict", {}), ("fallback", {"fallback": "eager"})):
            ns = load_case_namespace(case.source, str(path))
            run = minihop.function(ns["Fuzz"], **options)
            try:
                mine = _run(ns, run)
                for i, (e, m) in enumerate(zip(eager, mine, strict=True)):
                    for key in e:
                        _compare(e[key], m.get(key), f"call {i + 1} ({ns['SIZES'][i]} rows) {key}")
            except _Mismatch as e:
                return Outcome("mismatched", signature=f"{label} {e.category}: {str(e)[:160]}",
                               detail=str(e), error=e)
            except minihop.MinihopError as e:
                code = getattr(e, "code", "")
                if label == "strict" and code in DOCUMENTED_CODES and code not in _NOT_REFUSALS:
                    outcome = Outcome("refused", code=code, signature=_signature(e), error=e)
                    continue
                return Outcome("crashed", code=code, signature=f"{label} {_signature(e)}", detail=_detail(e), error=e)
            except Exception as e:
                return Outcome("crashed", signature=f"{label} {_signature(e)}", detail=_detail(e), error=e)
        return outcome or Outcome("matched")

