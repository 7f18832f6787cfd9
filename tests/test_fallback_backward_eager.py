"""``fallback="eager"`` when backward is refused after forward ran captured.

Forward ran through the capture; backward, traced again for the call (its grads laid out
otherwise, a flag it reads changed, sizes changed), is refused: it reads a forward tensor the
captured forward did not keep, takes a Python int from a dynamic size, ... Strict mode raises a
coded error; ``fallback="eager"`` must give what eager gives, so minihop runs the user's
backward eagerly on a ctx rebuilt for the call (``tracer/eager_backward.py``). Each case runs
one script eagerly, in strict mode and in fallback mode: fallback equals eager record for
record (values, every ``.grad``, what backward recorded); strict equals it or raises a
``MinihopError``.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import minihop
from minihop.errors import MinihopError
from tests import eager_modes
from tests.eager_modes import normalized, same_normalized

SEEN: list[Any] = []
FLAGS: dict[str, Any] = {"audit": False, "wide": False}


def _reset() -> None:
    SEEN.clear()
    FLAGS.update(audit=False, wide=False)


def _records(call: Callable[..., Any], script: Callable[[Callable[..., Any]], list[Any]]) -> Any:
    minihop.reset()
    _reset()
    torch.manual_seed(0)
    return normalized([*script(call), list(SEEN)])


def _check(fn_cls: type, script: Callable[[Callable[..., Any]], list[Any]], *, strict_refuses: bool,
           runs_eagerly: bool) -> None:
    """Fallback equals eager; strict equals eager or (``strict_refuses``: must) raises a coded
    error. ``runs_eagerly``: fallback ran the user's backward eagerly for a call (else it
    traced every backward: under fallback, forward keeps ctx's tensors, as eager does)."""
    eager = _records(fn_cls.apply, script)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fallback = _records(minihop.function(fn_cls, fallback="eager"), script)
    assert same_normalized(fallback, eager), f"fallback differs from eager:\n{fallback}\n{eager}"
    ran_eagerly = [w for w in caught if f"running {fn_cls.__qualname__}.backward eagerly" in str(w.message)]
    assert bool(ran_eagerly) == runs_eagerly, [str(w.message) for w in caught]
    try:
        strict = _records(minihop.function(fn_cls), script)
    except MinihopError:
        return
    assert not strict_refuses, "strict mode was expected to refuse this backward"
    assert same_normalized(strict, eager), f"strict differs from eager:\n{strict}\n{eager}"


# --- a forward tensor the captured forward did not keep -------------------------------------

class PicksByLayout(torch.autograd.Function):
    """Backward reads ``ctx.a`` for a contiguous grad, ``ctx.b`` otherwise (as code that takes
    a fast path for contiguous grads does): traced for a contiguous grad, forward keeps ``a``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.a = x * 2
        ctx.b = x * 3
        return x.sin()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if g.is_contiguous():
            return g * ctx.a
        return g * ctx.b


def _layout_script(call: Callable[..., Any]) -> list[Any]:
    out = []
    for i in range(3):
        x = torch.randn(4, 3, requires_grad=True)
        y = call(x)
        w = torch.randn(3, 4)
        # call 1: the grad is a transpose (not contiguous): backward takes the other path
        (y * w.t()).sum().backward() if i != 1 else (y.t() * w).sum().backward()
        out += [y, x.grad]
    return out


def test_unsaved_forward_tensor_is_kept_under_fallback() -> None:
    """Strict: refused when backward runs (forward kept only ``a``). Fallback: forward kept
    every tensor on ctx, as eager's does, so backward traced again for the call runs."""
    _check(PicksByLayout, _layout_script, strict_refuses=True, runs_eagerly=False)


class PicksByLayoutSaved(torch.autograd.Function):
    """The same choice, between two tensors handed to ``save_for_backward``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x * 2, x * w)
        return x * w

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        if g.is_contiguous():
            return g * a, None
        return g * b, g.sum() * 0 + b


def test_saved_tensors_of_an_eager_backward_are_the_calls() -> None:
    def script(call: Callable[..., Any]) -> list[Any]:
        out = []
        for i in range(3):
            x = torch.randn(4, 3, requires_grad=True)
            w = torch.randn(4, 3, requires_grad=True)
            y = call(x, w)
            (y.t() * torch.randn(3, 4)).sum().backward() if i == 2 else (y * 2).sum().backward()
            out += [y, x.grad, w.grad]
        return out

    _check(PicksByLayoutSaved, script, strict_refuses=False, runs_eagerly=False)


# --- a Python value from a dynamic size ----------------------------------------------------

class KeepsItsLength(torch.autograd.Function):
    """Forward puts a size on ctx (symbolic once sizes change) and a Box holding a tensor;
    backward, when the caller asks, records the size and scales by it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.n = x.shape[0]
        ctx.shape = x.shape
        ctx.box = Box(x.cos())
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if FLAGS["audit"]:
            SEEN.append((int(ctx.n), tuple(ctx.shape)))
            return g * ctx.box.value * float(ctx.n)
        return g * 2


@dataclasses.dataclass
class Box:
    value: torch.Tensor


def test_sizes_on_ctx_are_the_calls_when_backward_runs_eagerly() -> None:
    _check(KeepsItsLength, _audited_calls, strict_refuses=True, runs_eagerly=True)


def _audited_calls(call: Callable[..., Any]) -> list[Any]:
    """Four calls of two sizes; from the third, the caller asks backward to audit (flipped
    between forward and ``.backward()``)."""
    out = []
    for i in range(4):
        x = torch.randn(3 + i % 2, requires_grad=True)
        y = call(x)
        FLAGS["audit"] = i >= 2
        (y * 1.5).sum().backward()
        FLAGS["audit"] = False
        out += [y, x.grad]
    return out


# --- an argument object on ctx ---------------------------------------------------------------

class Settings:
    def __init__(self, scale: torch.Tensor, mode: str) -> None:
        self.scale = scale
        self.mode = mode


class UsesSettings(torch.autograd.Function):
    """ctx keeps the caller's settings object; backward takes another path for a grad that is
    not contiguous, reading a forward tensor the captured backward did not and a Python
    number from a size (sizes change between calls: dynamic)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, settings: Settings) -> torch.Tensor:
        ctx.settings = settings
        ctx.twice = settings.scale * 2
        return x * settings.scale

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        if not g.is_contiguous():
            return g * ctx.twice * float(g.shape[0]), None
        return g * ctx.settings.scale, None


def test_argument_object_on_ctx_is_the_calls() -> None:
    def script(call: Callable[..., Any]) -> list[Any]:
        out = []
        for i in range(4):
            settings = Settings(torch.tensor(float(i + 1)), "fast")
            x = torch.randn(3 + i % 2, requires_grad=True)
            y = call(x, settings)
            # call 3: an expanded grad (not contiguous): backward reads ctx.twice
            (y * 1.5).sum().backward() if i != 3 else y.sum().backward()
            out += [y, x.grad]
        return out

    _check(UsesSettings, script, strict_refuses=True, runs_eagerly=True)


# --- grad mode, None grads, needs_input_grad -------------------------------------------------

class DoubleBackward(torch.autograd.Function):
    """Differentiable backward that reads a size when asked; run with create_graph=True."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        if FLAGS["audit"]:
            SEEN.append((g.shape[0], torch.is_grad_enabled(), ctx.needs_input_grad))
        return g * 3 * x ** 2


def test_eager_backward_under_create_graph_is_differentiable() -> None:
    def script(call: Callable[..., Any]) -> list[Any]:
        out = []
        for i in range(4):
            x = torch.randn(3 + i % 2, requires_grad=True)
            y = call(x)
            FLAGS["audit"] = i == 3
            (gx,) = torch.autograd.grad(y.sum(), x, create_graph=True)
            FLAGS["audit"] = False
            (ggx,) = torch.autograd.grad(gx.sum(), x)
            out += [y, gx, ggx]
        return out

    _check(DoubleBackward, script, strict_refuses=True, runs_eagerly=True)


class TwoOutputsNoMaterialize(torch.autograd.Function):
    """Two outputs, grads not materialised: backward sees None for the unused one."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return x * 2, x * 3, 7

    @staticmethod
    def backward(ctx: Any, ga: torch.Tensor | None, gb: torch.Tensor | None, gn: Any) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        if FLAGS["audit"]:
            SEEN.append((ga is None, gb is None, gn is None, x.shape[0]))
        total = torch.zeros_like(x)
        if ga is not None:
            total = total + ga * 2
        if gb is not None:
            total = total + gb * 3
        return total


def test_none_grads_reach_an_eager_backward_as_none() -> None:
    def script(call: Callable[..., Any]) -> list[Any]:
        out = []
        for i in range(4):
            x = torch.randn(3 + i % 2, requires_grad=True)
            a, b, n = call(x)
            FLAGS["audit"] = i == 3
            (b * 1.5).sum().backward()
            FLAGS["audit"] = False
            out += [a, b, n, x.grad]
        return out

    _check(TwoOutputsNoMaterialize, script, strict_refuses=True, runs_eagerly=True)


class RaisesInBackward(torch.autograd.Function):
    """Backward raises the user's own error for a size it dislikes."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if FLAGS["audit"] and g.shape[0] == 4:
            SEEN.append("raising")
            raise ValueError("size 4 is not supported in backward")
        return g * 2


def _audit_last_call(caught: tuple[type[Exception], ...]) -> Callable[[Callable[..., Any]], list[Any]]:
    """Four calls, sizes alternating (dynamic from the second); the caller turns auditing on
    before the last ``.backward()``. An exception of ``caught`` is recorded (a minihop error
    is not: strict may raise one)."""
    def script(call: Callable[..., Any]) -> list[Any]:
        out: list[Any] = []
        for i in range(4):
            x = torch.randn(3 + i % 2, requires_grad=True)
            y = call(x)
            FLAGS["audit"] = i == 3
            try:
                (y * 1.5).sum().backward()
                out.append(x.grad)
            except MinihopError:
                raise
            except caught as e:
                out.append((type(e).__name__, str(e) if isinstance(e, ValueError) else "refused by autograd"))
            finally:
                FLAGS["audit"] = False
        return out

    return script


def test_user_error_of_an_eager_backward_propagates() -> None:
    _check(RaisesInBackward, _audit_last_call((ValueError,)), strict_refuses=True, runs_eagerly=True)


@pytest.mark.parametrize("count", ["too many", "wrong type"])
def test_bad_gradients_of_an_eager_backward_fail_as_eager(count: str) -> None:
    """A backward that returns what autograd refuses, on the eager path: an error, as in eager."""

    class BadReturn(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> Any:
            if FLAGS["audit"] and g.shape[0] >= 0:
                SEEN.append(int(g.shape[0]))
                return (g, g) if count == "too many" else "not a tensor"
            return g * 2

    _check(BadReturn, _audit_last_call((RuntimeError, TypeError)), strict_refuses=False, runs_eagerly=True)


# --- messages ---------------------------------------------------------------------------------

class WarnsThenTakesASize(torch.autograd.Function):
    """When asked, backward warns and logs, then takes a Python int from a dynamic size: traced
    again for that call, it is refused (strict: MH104). Fallback runs it eagerly: each message
    is sent once, as eager's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if FLAGS["audit"]:
            warnings.warn(f"grad norm {float(g.norm()):.3f}")
            eager_modes.LOG.info("backward of %d", g.shape[0])
            SEEN.append(int(g.shape[0]))
        return g * 2


def test_messages_before_a_refusal_are_sent_once_under_fallback() -> None:
    eager_modes.matches_eager(WarnsThenTakesASize, lambda i: (torch.randn(3 + i % 2, requires_grad=True),),
                              mid=lambda i: FLAGS.update(audit=i == 3), state=lambda: list(SEEN), reset=_reset,
                              steps=5)


class WarnsThenPrints(torch.autograd.Function):
    """When asked, backward warns and logs, then prints. Traced again for that call (sizes
    static), it would send the messages as it goes, then be refused at the print (MH106).
    Fallback must not send them twice (once by that trace, once by the eager backward): under
    fallback such a trace sends none, and the eager backward sends each once."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if FLAGS["audit"]:
            warnings.warn(f"grad norm {float(g.norm()):.3f}")
            eager_modes.LOG.info("backward of %d", g.shape[0])
            print("backward asked")
        return g * 2


def test_messages_of_a_refused_trace_are_not_sent_twice_under_fallback(capsys: Any) -> None:
    eager_modes.matches_eager(WarnsThenPrints, lambda i: (torch.randn(3, requires_grad=True),),
                              mid=lambda i: FLAGS.update(audit=i == 2), reset=_reset, steps=4)
    printed = capsys.readouterr().out.count("backward asked")
    assert printed == 2  # eager's backward and fallback's eager one (strict and apply refuse the print)


# --- what the rebuild could not make: sizes inside an object, a tensor never used -----------

class SizeInABox(torch.autograd.Function):
    """Forward keeps its length inside an object it makes (``ctx.box = Box(n)``): symbolic once
    sizes change. Backward run eagerly gets a Box holding this call's length (it was refused)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.box = Box(x.shape[0])
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if FLAGS["audit"]:
            SEEN.append(int(ctx.box.value))
            return g * float(ctx.box.value)
        return g * 2


WEIGHTS = torch.tensor([1.0, 2.0, 3.0, 4.0])


class KeepsAGlobalUnused(torch.autograd.Function):
    """Forward puts a global tensor on ctx without using it in an op; backward, when the
    caller asks, takes a size from its grad (refused when traced again). Fallback refused this
    after forward ran ("a forward tensor the captured forward did not keep")."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.w = WEIGHTS
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if FLAGS["audit"]:
            SEEN.append(int(g.shape[0]))
            return g * ctx.w[: g.shape[0]]
        return g * 2


def test_sizes_inside_an_object_on_ctx_are_the_calls() -> None:
    _check(SizeInABox, _audited_calls, strict_refuses=True, runs_eagerly=True)


def test_a_global_tensor_forward_never_used_is_kept_for_an_eager_backward() -> None:
    """The captured forward keeps it (lifted from its global when forward runs, as eager's
    ctx holds the object the global held then), so backward run eagerly gets it."""
    _check(KeepsAGlobalUnused, _audited_calls, strict_refuses=True, runs_eagerly=True)


class KeepsGlobalsInAList(torch.autograd.Function):
    """As KeepsAGlobalUnused, with the tensor inside a list on ctx: not lifted, so no call
    could rebuild it. Refused at capture under fallback (forward runs eagerly too), never
    after forward ran."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.ws = [WEIGHTS]
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if FLAGS["audit"]:
            SEEN.append(int(g.shape[0]))
            return g * ctx.ws[0][: g.shape[0]]
        return g * 2


def test_a_tensor_no_call_could_rebuild_runs_the_function_eagerly() -> None:
    minihop.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        minihop.function(KeepsGlobalsInAList, fallback="eager")(torch.ones(3, requires_grad=True))
    assert any("ctx.ws, a tensor" in str(w.message) or "on ctx.ws a tensor it never uses" in str(w.message)
               for w in caught), [str(w.message) for w in caught]
    assert minihop.counters()["captures"] == 0 and minihop.counters()["fallbacks"] == 1
    _check(KeepsGlobalsInAList, _audited_calls, strict_refuses=True, runs_eagerly=False)


# --- a second backward of the call (retain_graph=True) after one ran eagerly ---------------

class CountsItsBackwards(torch.autograd.Function):
    """Backward counts its runs on ctx and, when the caller asks, takes a size from its grad
    (refused when traced again): eager's second backward of a call sees the first's count."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.calls = 0
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        ctx.calls += 1
        if FLAGS["audit"]:
            SEEN.append((ctx.calls, int(g.shape[0])))
        return g * ctx.calls


class CountsWithoutForward(CountsItsBackwards):
    """The same, with nothing left on ctx by forward (``getattr(ctx, "calls", 0)``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        ctx.calls = getattr(ctx, "calls", 0) + 1
        if FLAGS["audit"]:
            SEEN.append((ctx.calls, int(g.shape[0])))
        return g * ctx.calls


def _twice_per_call(call: Callable[..., Any]) -> list[Any]:
    out = []
    for i in range(3):
        x = torch.randn(3 + i % 2, requires_grad=True)
        y = call(x)
        FLAGS["audit"] = i >= 1
        y.sum().backward(retain_graph=True)
        y.sum().backward()
        FLAGS["audit"] = False
        out += [y, x.grad]
    return out


@pytest.mark.parametrize("fn_cls", [CountsItsBackwards, CountsWithoutForward])
def test_a_second_backward_after_an_eager_one_shares_its_ctx(fn_cls: type) -> None:
    """Before, the second backward was rebuilt from what forward left: count 1 again, not 2."""
    _check(fn_cls, _twice_per_call, strict_refuses=True, runs_eagerly=True)
