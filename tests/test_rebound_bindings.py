"""Hostile spellings, round 8: code a capture ran, rebound where its key did not look.

Each was a silent difference from eager before this round, in strict and apply mode (the
capture was reused with the code it was traced with), unless said:

- a user class's dunder method rebound (``Act.__call__ = ...`` for an object passed in or held
  in a global: ``act(x)`` runs the new one): a class's state was keyed without its dunders;
- a user ``nn.Module``'s class method rebound (``MyMod.forward = ...``): a module was keyed by
  its type, its attributes and its hooks, not its class's state;
- a library module's function rebound by anyone (``F.gelu = F.silu``, ``torch.tanh =
  torch.sigmoid``): a chain below a library module was not a read;
- a user function set on ``torch.Tensor`` (``torch.Tensor.double_it = ...``): a tensor was a
  value no user code could run through;
- a ``staticmethod(functools.partial(...))`` on a class, its keywords changed in place: keyed
  by the partial's identity;
- a hook registered for every module (``register_module_forward_hook``) between calls: a
  module was keyed by its own hooks only;
- another Function's ``forward`` rebound (``Inner.apply`` inside forward): a Function class was
  keyed by its identity.

The operator dunders (``__rmul__``, ``__float__``, ...) and a callable in a list matched eager
before (each capture was single-use: code not analysed ran); they stay, crossed with the fix.

Each runs against eager in strict, apply and fallback mode (``eager_modes.matches_eager``).
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as TF
from torch import nn

import minihop
from eager_modes import matches_eager


def x_(i):
    return (torch.linspace(-1, 1, 4) + i).requires_grad_()


class Applies(torch.autograd.Function):
    """``forward(x, f)``: ``f(x)``, whatever ``f`` is."""

    @staticmethod
    def forward(ctx, x, f):
        return f(x)

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


def _scaled(k):
    return lambda self, x: x * k


@pytest.mark.parametrize("held", ["argument", "global", "list item"])
def test_callable_object_whose_class_call_is_rebound(held) -> None:
    """``Act.__call__`` rebound between calls: ``act(x)`` runs the new one, as in eager."""

    class Act:
        def __call__(self, x):
            return x * 2

    act = Act()
    original = Act.__call__

    class ViaGlobal(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return ACT[0](x)

        @staticmethod
        def backward(ctx, g):
            return g * 2

    ACT = [act]

    def between(i):
        Act.__call__ = _scaled(2.0 + i)

    def reset():
        Act.__call__ = original

    if held == "global":
        matches_eager(ViaGlobal, lambda i: (x_(i),), between=between, reset=reset)
    else:
        fn = Applies if held == "argument" else _ListApplies
        matches_eager(fn, lambda i: (x_(i), act if held == "argument" else [act]), between=between, reset=reset)


class _ListApplies(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fs):
        return fs[0](x)

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


@pytest.mark.parametrize("dunder", ["__rmul__", "__float__", "__getitem__", "__len__", "__bool__"])
def test_operator_dunders_rebound(dunder) -> None:
    """The dunder behind ``x * s``, ``float(s)``, ``s["k"]``, ``len(s)``, ``if s`` rebound
    between calls."""

    class S:
        def __rmul__(self, x):
            return x * 2.0

        def __float__(self):
            return 2.0

        def __getitem__(self, k):
            return 2.0

        def __len__(self):
            return 2

        def __bool__(self):
            return True

    use = {"__rmul__": lambda x, s: x * s, "__float__": lambda x, s: x * float(s),
           "__getitem__": lambda x, s: x * s["k"], "__len__": lambda x, s: x * len(s),
           "__bool__": lambda x, s: x * 2 if s else x * 3}[dunder]
    answers = {"__rmul__": lambda i: (lambda self, x: x * (2.0 + i)), "__float__": lambda i: (lambda self: 2.0 + i),
               "__getitem__": lambda i: (lambda self, k: 2.0 + i), "__len__": lambda i: (lambda self: 2 + i),
               "__bool__": lambda i: (lambda self: i % 2 == 0)}[dunder]
    original = S.__dict__[dunder]

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, s):
            return USE(x, s)

        @staticmethod
        def backward(ctx, g):
            return g, None

    USE = use
    s = S()
    matches_eager(F, lambda i: (x_(i), s), between=lambda i: setattr(S, dunder, answers(i)),
                  reset=lambda: setattr(S, dunder, original))


def test_user_module_class_method_rebound() -> None:
    """``MyMod.forward = ...`` between calls, the module passed in: torch's ``Module.__call__``
    calls the new one."""

    class MyMod(nn.Module):
        def forward(self, x):
            return x * 2

    m = MyMod()
    original = MyMod.forward

    def between(i):
        MyMod.forward = _scaled(2.0 + i)

    matches_eager(Applies, lambda i: (x_(i), m), between=between, reset=lambda: setattr(MyMod, "forward", original))


@pytest.mark.parametrize("spelling", ["F.gelu", "torch.nn.functional.gelu", "torch.tanh"])
def test_library_function_rebound(spelling) -> None:
    """A library module's function rebound by anyone between calls (a faster kernel patched
    in: ``F.gelu = fast_gelu``): the call runs the one bound now, as in eager."""
    owner, name = {"F.gelu": (TF, "gelu"), "torch.nn.functional.gelu": (torch.nn.functional, "gelu"),
                   "torch.tanh": (torch, "tanh")}[spelling]
    original = getattr(owner, name)

    class ViaF(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return TF.gelu(x)

        @staticmethod
        def backward(ctx, g):
            return g * 2

    class ViaTorch(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.nn.functional.gelu(x) if spelling.startswith("torch.nn") else torch.tanh(x)

        @staticmethod
        def backward(ctx, g):
            return g * 2

    def between(i):
        setattr(owner, name, original if i % 2 == 0 else TF.silu)

    try:
        matches_eager(ViaF if spelling == "F.gelu" else ViaTorch, lambda i: (x_(i),), between=between,
                      reset=lambda: setattr(owner, name, original))
    finally:
        setattr(owner, name, original)


def test_library_function_rebound_before_backward() -> None:
    """``torch.cos`` rebound between forward and ``.backward()``: backward calls the new one."""
    original = torch.cos

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin()

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * torch.cos(x)

    try:
        matches_eager(F, lambda i: (x_(i),), between=lambda i: setattr(torch, "cos", original),
                      mid=lambda i: setattr(torch, "cos", torch.sin if i % 2 else original),
                      reset=lambda: setattr(torch, "cos", original))
    finally:
        torch.cos = original


def test_library_binding_is_an_identity_guard() -> None:
    """``explain`` lists the binding in the identity record, and a direct capture called after
    the rebinding says which name changed, from what to what."""
    original = TF.gelu

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return TF.gelu(x)

        @staticmethod
        def backward(ctx, g):
            return g

    x = x_(0)
    text = str(minihop.explain(F, x))
    assert "TF.gelu is torch._C._nn.gelu" in text, text
    cap = minihop.capture(F, x)
    TF.gelu = TF.silu
    try:
        with pytest.raises(minihop.GuardMismatchError, match=r"TF.gelu .*torch._C._nn.gelu.*torch.nn.functional.silu"):
            cap(x)
    finally:
        TF.gelu = original
    torch.testing.assert_close(cap(x), F.apply(x), rtol=0, atol=0)


def test_user_function_set_on_tensor() -> None:
    """``torch.Tensor.double_it = ...``, rebound between calls: each call runs the one set now
    (code minihop did not analyse runs on every tensor: each capture is single-use)."""

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.double_it()

        @staticmethod
        def backward(ctx, g):
            return g * 2

    def between(i):
        torch.Tensor.double_it = lambda self: self * (2 + i)

    try:
        matches_eager(F, lambda i: (x_(i),), between=between)
    finally:
        del torch.Tensor.double_it


@pytest.mark.parametrize("held", ["global", "argument"])
def test_static_partial_keywords_changed_in_place(held) -> None:
    """``act = staticmethod(functools.partial(torch.mul, other=2.0))`` on a class, its keywords
    changed in place between calls: a class's method was keyed by the partial's identity."""

    class Ops:
        act = staticmethod(functools.partial(torch.mul, other=2.0))

    class ViaGlobal(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return Ops.act(x)

        @staticmethod
        def backward(ctx, g):
            return g

    class ViaArgument(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, ops):
            return ops.act(x)

        @staticmethod
        def backward(ctx, g):
            return g, None

    def between(i):
        Ops.__dict__["act"].__func__.keywords["other"] = 2.0 + i

    if held == "global":
        matches_eager(ViaGlobal, lambda i: (x_(i),), between=between)
    else:
        matches_eager(ViaArgument, lambda i: (x_(i), Ops), between=between)


@pytest.mark.parametrize("kind", ["forward", "forward_pre"])
def test_global_module_hook_registered_between_calls(kind) -> None:
    """``register_module_forward_hook`` (every module's call runs it: torch's process-wide
    state) registered between calls, for a module held in a global or passed in: a module was
    keyed by its own hooks only."""
    from torch.nn.modules import module as module_state

    lin = nn.Linear(4, 4)
    register = getattr(module_state, f"register_module_{kind}_hook")
    hook = (lambda m, inp, out: out * 10) if kind == "forward" else (lambda m, inp: (inp[0] * 10,))
    handles = []

    def between(i):
        while handles:
            handles.pop().remove()
        if i % 2:
            handles.append(register(hook))

    def reset():
        while handles:
            handles.pop().remove()

    try:
        matches_eager(Applies, lambda i: (x_(i), lin), between=between, reset=reset)
    finally:
        reset()


@pytest.mark.parametrize("style", ["staticmethod", "classmethod"])
def test_inner_function_method_rebound(style) -> None:
    """``Inner.forward`` rebound between calls (another implementation patched in), the outer
    forward calling ``Inner.apply``: a Function class was keyed by its identity only."""
    wrap = staticmethod if style == "staticmethod" else classmethod

    class Inner(torch.autograd.Function):
        forward = wrap(lambda *a: a[-1] * 2)
        backward = wrap(lambda *a: a[-1] * 2)

    class Outer(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return Inner.apply(x)

        @staticmethod
        def backward(ctx, g):
            return g

    original = Inner.__dict__["forward"]

    def between(i):
        Inner.forward = wrap(lambda *a: a[-1] * (2 + i))

    matches_eager(Outer, lambda i: (x_(i),), between=between, reset=lambda: setattr(Inner, "forward", original))
