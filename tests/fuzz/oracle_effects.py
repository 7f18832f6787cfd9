"""Oracle for Functions with effects: run a Function eagerly, through ``minihop.function(F)``
(strict) and ``minihop.function(F, fallback="eager")`` on fresh state, and compare.

Used by ``tests/test_effects.py`` (hand-written cases) and ``generate_effects.py`` (generated
ones). A case is a ``make()`` returning ``(F, args_of_call(i), state())``, or with a fourth
``between(i)`` that changes state after call ``i``'s forward and before its ``.backward()``
(through an alias, as user code between the two would); each mode gets its own ``make()`` so
its Python state starts fresh. Compared per call: outputs, every input's
``.grad``, the Python state between forward and ``.backward()`` and after it, the warnings
the user's code gave; after all calls, torch's global random stream. Strict may refuse with a
coded ``MinihopError`` (the comparison stops there); fallback must equal eager exactly.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

import minihop
from minihop.errors import MinihopError

__all__ = ["Outcome", "run_mode", "compare"]

Make = Callable[[], tuple[type, Callable[[int], tuple[Any, ...]], Callable[[], Any]]]
Outcome = list[tuple[Any, ...]]


def run_mode(mode: str, make: Make, calls: int = 3) -> Outcome:
    """What ``calls`` calls in ``mode`` ("eager", "strict", "fallback") did, one record each."""
    torch.manual_seed(1234)
    fn_cls, args_of, state, *hook = make()
    call = {"eager": fn_cls.apply, "strict": minihop.function(fn_cls),
            "fallback": minihop.function(fn_cls, fallback="eager")}[mode]
    records: Outcome = []
    for i in range(calls):
        args = args_of(i)
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                out = call(*args)
                between = repr(state())
                if hook:
                    hook[0](i)
                outs = out if isinstance(out, tuple) else (out,)
                loss = sum((o.float() * (k + 1)).sum() for k, o in enumerate(outs)
                           if isinstance(o, torch.Tensor) and o.requires_grad)
                if isinstance(loss, torch.Tensor):
                    loss.backward()
            records.append((
                "ok", [o.detach().clone() if isinstance(o, torch.Tensor) else o for o in outs],
                [a.grad.clone() if isinstance(a, torch.Tensor) and a.grad is not None else None
                 for a in args],
                between, repr(state()),
                [str(w.message) for w in seen if not str(w.message).startswith("minihop")]))
        except MinihopError as e:
            records.append(("refused", type(e).__name__, str(e).splitlines()[0]))
            break
        except Exception as e:  # the user's own error: eager must raise the same
            records.append(("raised", type(e).__name__, str(e)))
    records.append(("random stream", torch.get_rng_state().clone()))
    return records


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        # (NaN where eager has NaN is the same: a Normal of a negative scale gives NaNs, unvalidated)
        return a.shape == b.shape and a.dtype == b.dtype and (torch.equal(a, b) or bool(
            (a.is_floating_point() or a.is_complex()) and ((a == b) | (a.isnan() & b.isnan())).all()))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def compare(make: Make, calls: int = 3) -> dict[str, str]:
    """``{"strict": verdict, "fallback": verdict}``: "same", "refused <code>: <message>"
    (strict only), or "differs: <first difference>"."""
    eager = run_mode("eager", make, calls)
    verdicts: dict[str, str] = {}
    for mode in ("strict", "fallback"):
        got = run_mode(mode, make, calls)
        if _same(got, eager):
            verdicts[mode] = "same"
            continue
        refused = [r for r in got if r[0] == "refused"]
        if refused and mode == "strict":
            verdicts[mode] = f"refused {refused[0][1]}: {refused[0][2]}"
            continue
        first = next((i for i, (g, e) in enumerate(zip(got, eager)) if not _same(g, e)), None)
        where = (got[first], eager[first]) if first is not None else (len(got), len(eager))
        verdicts[mode] = f"differs: call {first}: got {where[0]!r:.300} eager {where[1]!r:.300}"
    return verdicts
