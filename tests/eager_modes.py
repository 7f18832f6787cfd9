"""Running one script of calls eagerly and through minihop's three ways of calling, and
comparing their records exactly (test_backward_reads, test_argument_containers_on_ctx), and
``matches_eager``: the hostile cases' harness (test_outside_spellings_2, test_open_reads)."""

from __future__ import annotations

import logging
import random
import warnings
from collections.abc import Callable
from typing import Any

import torch

import minihop
from minihop.errors import MinihopError

__all__ = ["LOG", "MODES", "caller", "matches_eager", "normalized", "same", "same_normalized"]

MODES = ("strict", "apply", "fallback")


def caller(mode: str, fn: type) -> Callable[..., Any]:
    """``fn``'s apply as ``mode`` calls it: "eager", "strict" (``minihop.function``), "apply"
    (``minihop.apply``) or "fallback" (``minihop.function(fn, fallback="eager")``)."""
    if mode == "eager":
        return fn.apply
    if mode == "strict":
        return minihop.function(fn)
    if mode == "apply":
        return lambda *args: minihop.apply(fn, *args)
    return minihop.function(fn, fallback="eager")


def same(eager: Any, mine: Any, what: str) -> None:
    """Equal records: tensors bit for bit (dtype and shape too), containers item by item."""
    if isinstance(eager, torch.Tensor) or isinstance(mine, torch.Tensor):
        assert isinstance(eager, torch.Tensor) and isinstance(mine, torch.Tensor), (what, eager, mine)
        assert (eager.dtype, eager.shape) == (mine.dtype, mine.shape), (what, eager, mine)
        torch.testing.assert_close(mine, eager, rtol=0, atol=0, msg=what)
    elif isinstance(eager, (tuple, list)):
        assert len(eager) == len(mine), (what, eager, mine)
        for i, (e, m) in enumerate(zip(eager, mine, strict=True)):
            same(e, m, f"{what}[{i}]")
    else:
        assert eager == mine, (what, eager, mine)


def normalized(v: Any) -> Any:
    """A comparable copy of a recorded value (tensors with their properties, floats by bits)."""
    if isinstance(v, torch.Tensor):
        return ("T", tuple(v.shape), v.dtype, v.requires_grad, v.detach().clone())
    if isinstance(v, float):
        return ("float", v.hex())
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(normalized(x) for x in v))
    if isinstance(v, dict):
        return ("dict", tuple((repr(k), normalized(x)) for k, x in v.items()))
    return (type(v).__name__, v)


def same_normalized(a: Any, b: Any) -> bool:
    """Whether two ``normalized`` records agree (tensors to float tolerance)."""
    if isinstance(a, tuple) and a[:1] == ("T",):
        if not (isinstance(b, tuple) and b[:1] == ("T",) and a[1:4] == b[1:4]):
            return False
        return bool(torch.allclose(a[4], b[4], rtol=1e-5, atol=1e-6, equal_nan=True))
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same_normalized(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


# -- one script of calls with state changed between calls and before backward (hostile cases) --

LOG = logging.getLogger("minihop.tests.hostile")
LOG.setLevel(logging.INFO)
LOG.propagate = False


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


RECORDS = _Records()
LOG.addHandler(RECORDS)


def _loss(out: Any) -> Any:
    outs = out if isinstance(out, tuple) else (out,)
    return sum((o * (k + 1.5)).sum() for k, o in enumerate(outs)
               if isinstance(o, torch.Tensor) and o.requires_grad)


def _run(call: Callable[..., Any], make_args: Callable[[int], tuple[Any, ...]], steps: int,
         between: Callable[[int], None], mid: Callable[[int], None],
         state: Callable[[], Any], backwards: int = 1) -> tuple[list[Any], bool]:
    """Per call: output, state after forward, grads, state after backward, the warnings and
    log lines of the call (or eager's exception and phase); last, the random stream.
    ``backwards`` > 1: the loss is differentiated that many times (``retain_graph``)."""
    records: list[Any] = []
    torch.manual_seed(0)
    random.seed(0)
    for i in range(steps):
        between(i)
        args = make_args(i)
        phase = "forward"
        RECORDS.lines.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out = call(*args)
                after_forward = normalized(state())
                mid(i)
                phase = "backward"
                loss = _loss(out)
                if isinstance(loss, torch.Tensor):
                    for k in range(backwards):
                        loss.backward(retain_graph=k + 1 < backwards)
                records.append((normalized(out), after_forward,
                                normalized([a.grad for a in args if isinstance(a, torch.Tensor)]),
                                normalized(state())))
            except MinihopError:
                return records, True
            except Exception as e:  # eager's own exception must be the capture's, same phase
                records.append((phase, type(e).__name__, str(e), normalized(state())))
        # fallback's own notice ("minihop: running F eagerly") is minihop's, not the call's
        records.append(([str(w.message) for w in caught if not str(w.message).startswith("minihop:")],
                        list(RECORDS.lines)))
    records.append(normalized(torch.rand(2)))
    return records, False


def matches_eager(fn_cls: type, make_args: Callable[[int], tuple[Any, ...]], *, steps: int = 4,
                  between: Callable[[int], None] = lambda i: None,
                  mid: Callable[[int], None] = lambda i: None,
                  state: Callable[[], Any] = lambda: None,
                  reset: Callable[[], None] = lambda: None, refusable: bool = True,
                  backwards: int = 1) -> None:
    """``fn_cls`` called ``steps`` times eagerly and in strict, apply and fallback mode, with
    ``between(i)`` before call ``i`` and ``mid(i)`` between its forward and backward: every
    record equal, or (strict and apply, where ``refusable``) a coded refusal."""
    reset()
    eager, _ = _run(fn_cls.apply, make_args, steps, between, mid, state, backwards)
    modes = {"strict": minihop.function(fn_cls), "apply": lambda *a: minihop.apply(fn_cls, *a),
             "fallback": minihop.function(fn_cls, fallback="eager")}
    for mode, call in modes.items():
        minihop.reset()
        reset()
        got, refused = _run(call, make_args, steps, between, mid, state, backwards)
        assert not (refused and (mode == "fallback" or not refusable)), f"{mode} refused"
        n = len(got) if refused else len(eager)
        assert same_normalized(tuple(got[:n]), tuple(eager[:n])), f"{mode} differs from eager:\n{got}\n{eager}"
