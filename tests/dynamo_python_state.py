"""Python-state cases for autograd.Functions, run under eager and under Dynamo (torch.compile).

Place: a helper module beside the tests (not a test file): ``docs/parity.md``'s "Python state"
rows were measured with it, and ``tests/test_python_state.py`` can import its Functions and
protocols. ``python tests/dynamo_python_state.py`` runs every case three ways: eager
``F.apply``; ``torch.compile(run, backend="aot_eager", fullgraph=True)``; and the default
``fullgraph=False``; and prints, per case, eager's record and whether each Dynamo run gave the
same record, a different one (and how), a graph break, or an error.

A case is a *protocol*: ``protocol(call)`` resets the case's Python state, calls ``call`` (which
wraps ``F.apply``) several times, changes the state between calls or between forward and
``.backward()``, and returns a record: outputs, ``.grad``s and the Python state seen after each
step. Two runs agree when their records are equal. The Functions live in this file (Dynamo
reads their source).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["CASES", "run_all"]

Call = Callable[..., Any]


def _x() -> torch.Tensor:
    return torch.tensor([1.0, 2.0, 3.0], requires_grad=True)


def _r(t: Any) -> Any:
    """A comparable, printable form of a value."""
    if isinstance(t, torch.Tensor):
        return [round(v, 4) for v in t.detach().reshape(-1).tolist()]
    if isinstance(t, (list, tuple)):
        return type(t)(_r(v) for v in t)
    return t


# ---------------------------------------------------------------------------------------------
# Reads of Python values that change
# ---------------------------------------------------------------------------------------------

class ClassScale(torch.autograd.Function):
    scale = 2.0

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * ClassScale.scale

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * ClassScale.scale


class Config:
    def __init__(self, scale: float = 2.0) -> None:
        self.scale = scale
        self.calls = 0


class ArgScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cfg: Config) -> torch.Tensor:
        ctx.cfg = cfg
        return x * cfg.scale

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g * ctx.cfg.scale, None


SCALE = 2.0


class GlobalScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * SCALE

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * SCALE


def make_closure_scale() -> tuple[type, Callable[[float], None]]:
    """A Function reading a closure cell, and a setter that rebinds the cell."""
    scale = 2.0

    class ClosureScale(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * scale

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * scale

    def set_scale(value: float) -> None:
        nonlocal scale
        scale = value

    return ClosureScale, set_scale


ClosureScale, set_closure_scale = make_closure_scale()


def _set_global(value: float) -> None:
    global SCALE
    SCALE = value


def _readers() -> dict[str, tuple[type, Callable[[float], None], Callable[[torch.Tensor], tuple[Any, ...]]]]:
    """kind -> (Function, set the value, the apply arguments after x)."""
    cfg = Config()

    def set_class(v: float) -> None:
        ClassScale.scale = v

    def set_cfg(v: float) -> None:
        cfg.scale = v

    return {
        "class attr": (ClassScale, set_class, lambda x: (x,)),
        "argument-object attr": (ArgScale, set_cfg, lambda x: (x, cfg)),
        "global": (GlobalScale, _set_global, lambda x: (x,)),
        "closure cell": (ClosureScale, set_closure_scale, lambda x: (x,)),
    }


def read_changed_between_calls(kind: str) -> Callable[[Call], list[Any]]:
    def protocol(call: Call) -> list[Any]:
        fn, set_value, args = _readers()[kind]
        record = []
        for value in (2.0, 3.0, 2.0):
            set_value(value)
            x = _x()
            y = call(fn, *args(x))
            y.sum().backward()
            record.append(("value", value, "out", _r(y), "grad", _r(x.grad)))
        set_value(2.0)
        return record
    return protocol


def read_changed_before_backward(kind: str) -> Callable[[Call], list[Any]]:
    def protocol(call: Call) -> list[Any]:
        fn, set_value, args = _readers()[kind]
        record = []
        for fwd_value, bwd_value in ((2.0, 3.0), (2.0, 5.0)):
            set_value(fwd_value)
            x = _x()
            y = call(fn, *args(x))
            set_value(bwd_value)
            y.sum().backward()
            record.append(("fwd", fwd_value, "bwd", bwd_value, "out", _r(y), "grad", _r(x.grad)))
        set_value(2.0)
        return record
    return protocol


# ---------------------------------------------------------------------------------------------
# Python side effects
# ---------------------------------------------------------------------------------------------

class ClassCounter(torch.autograd.Function):
    calls = 0

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ClassCounter.calls += 1
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2


class ArgCounter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cfg: Config) -> torch.Tensor:
        cfg.calls += 1
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g * 2, None


LOG: list[Any] = []


class Logged(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        LOG.append(("forward", x.shape[0]))
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        LOG.append("backward")
        return g * 2


class Recorder:
    last_size: int | None = None


RECORDER = Recorder()


class SetsAttribute(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        RECORDER.last_size = x.shape[0]
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2


CALLS = 0


class GlobalCounter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        global CALLS
        CALLS += 1
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2


class Prints(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        print("forward", x.shape[0])
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        print("backward")
        return g * 2


DEBUG = False


class DebugPrints(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        if DEBUG:
            print("forward", x.shape[0])
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if DEBUG:
            print("backward")
        return g * 2


def _side_effect(fn: type, args: Callable[[torch.Tensor], tuple[Any, ...]], reset: Callable[[], None],
                 state: Callable[[], Any]) -> Callable[[Call], list[Any]]:
    def protocol(call: Call) -> list[Any]:
        reset()
        record = []
        out = io.StringIO()
        for _ in range(3):
            x = _x()
            with contextlib.redirect_stdout(out):
                y = call(fn, *args(x))
                after_forward = state()
                y.sum().backward()
            record.append(("out", _r(y), "grad", _r(x.grad), "state after fwd", after_forward,
                           "after bwd", state(), "stdout", out.getvalue().count("\n")))
        reset()
        return record
    return protocol


_CFG = Config()


def _reset_class() -> None:
    ClassCounter.calls = 0


def _reset_cfg() -> None:
    _CFG.calls = 0


def _reset_log() -> None:
    LOG.clear()


def _reset_recorder() -> None:
    RECORDER.last_size = None


def _reset_calls() -> None:
    global CALLS
    CALLS = 0


def _nothing() -> None:
    pass


# ---------------------------------------------------------------------------------------------
# Tensors leaving forward by other ways than its return value
# ---------------------------------------------------------------------------------------------

class OutputAttribute(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        soft = x.sigmoid()
        hard = (soft > 0.9).float()
        hard._soft = soft
        return hard

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g


class IntoList(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, stash: list[Any]) -> torch.Tensor:
        stash.append(x * 10)
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g * 2, None


class Holder:
    t: torch.Tensor | None = None


class OntoObject(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, holder: Holder) -> torch.Tensor:
        holder.t = x * 10
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g * 2, None


class UpdatesBuffer(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, running: torch.Tensor) -> torch.Tensor:
        running.mul_(0.5).add_(x.detach().mean())
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g * 2, None


def output_attribute(call: Call) -> list[Any]:
    record = []
    for _ in range(2):
        x = _x()
        y = call(OutputAttribute, x)
        soft = getattr(y, "_soft", "missing")
        y.sum().backward()
        record.append(("out", _r(y), "out._soft", _r(soft), "its requires_grad",
                       getattr(soft, "requires_grad", None), "grad", _r(x.grad)))
    return record


def into_list(call: Call) -> list[Any]:
    record = []
    for _ in range(2):
        stash: list[Any] = []
        x = _x()
        y = call(IntoList, x, stash)
        y.sum().backward()
        record.append(("out", _r(y), "stash", _r(stash), "its requires_grad",
                       [t.requires_grad for t in stash], "grad", _r(x.grad)))
    return record


def onto_object(call: Call) -> list[Any]:
    record = []
    for _ in range(2):
        holder = Holder()
        x = _x()
        y = call(OntoObject, x, holder)
        y.sum().backward()
        record.append(("out", _r(y), "holder.t", _r(holder.t), "its requires_grad",
                       getattr(holder.t, "requires_grad", None), "grad", _r(x.grad)))
    return record


def buffer_in_place(call: Call) -> list[Any]:
    record = []
    running = torch.zeros(3)
    for _ in range(3):
        x = _x()
        y = call(UpdatesBuffer, x, running)
        y.sum().backward()
        record.append(("out", _r(y), "running", _r(running), "grad", _r(x.grad)))
    return record


CASES: dict[str, Callable[[Call], list[Any]]] = {
    **{f"{k} read, changed between calls": read_changed_between_calls(k) for k in _readers()},
    **{f"{k} read, changed between forward and backward": read_changed_before_backward(k)
       for k in _readers()},
    "class counter (`F.calls += 1`)": _side_effect(ClassCounter, lambda x: (x,), _reset_class,
                                                    lambda: ClassCounter.calls),
    "argument counter (`cfg.calls += 1`)": _side_effect(ArgCounter, lambda x: (x, _CFG), _reset_cfg,
                                                         lambda: _CFG.calls),
    "`LOG.append(...)` of Python values": _side_effect(Logged, lambda x: (x,), _reset_log,
                                                       lambda: list(LOG)),
    "attribute set on an outside object": _side_effect(SetsAttribute, lambda x: (x,), _reset_recorder,
                                                       lambda: RECORDER.last_size),
    "global assignment (`global CALLS; CALLS += 1`)": _side_effect(GlobalCounter, lambda x: (x,),
                                                                   _reset_calls, lambda: CALLS),
    "`print`": _side_effect(Prints, lambda x: (x,), _nothing, lambda: None),
    "`if DEBUG: print(...)`, DEBUG False": _side_effect(DebugPrints, lambda x: (x,), _nothing,
                                                        lambda: None),
    "output attribute (`hard._soft = soft`)": output_attribute,
    "tensor into a list argument": into_list,
    "tensor onto an argument object": onto_object,
    "unreturned input buffer updated in place": buffer_in_place,
}


# ---------------------------------------------------------------------------------------------
# Runners
# ---------------------------------------------------------------------------------------------

def eager_call(fn: type, *args: Any) -> Any:
    return fn.apply(*args)


def compiled_call(fullgraph: bool) -> Call:
    def run(fn: type, *args: Any) -> Any:
        return fn.apply(*args)

    compiled = torch.compile(run, backend="aot_eager", fullgraph=fullgraph)
    return compiled


def _diff(eager: list[Any], other: list[Any]) -> str:
    for i, (e, o) in enumerate(zip(eager, other)):
        if e != o:
            pairs = [f"{e[j - 1]} {o[j]} (eager {e[j]})" for j in range(1, len(e), 2) if e[j] != o[j]]
            return f"call {i + 1}: " + "; ".join(pairs)
    return f"{len(other)} steps instead of {len(eager)}"


def run_one(protocol: Callable[[Call], list[Any]], fullgraph: bool, eager: list[Any]) -> str:
    """One Dynamo run of a protocol, described against eager's record."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    try:
        record = protocol(compiled_call(fullgraph))
    except Exception as error:  # noqa: BLE001 - what Dynamo raised is the observation
        first = (str(error).strip().splitlines() or [""])[0][:140]
        return f"error: {type(error).__name__}: {first}"
    breaks = dict(counters["graph_break"])
    verdict = "same as eager" if record == eager else "WRONG: " + _diff(eager, record)
    if breaks:
        reasons = "; ".join(sorted({r.splitlines()[0][:90] for r in breaks}))
        verdict += f" (graph break: {reasons})"
    return verdict


def run_all() -> dict[str, tuple[list[Any], str, str]]:
    """case -> (eager's record, fullgraph=True verdict, fullgraph=False verdict)."""
    results = {}
    for name, protocol in CASES.items():
        eager = protocol(eager_call)
        results[name] = (eager, run_one(protocol, True, eager), run_one(protocol, False, eager))
    return results


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore")
    for name, (eager, full, default) in run_all().items():
        print(f"### {name}\n  eager: {eager}\n  fullgraph=True:  {full}\n  fullgraph=False: {default}\n")
