"""A tensor backward reads from a global, a closure cell or an attribute, against eager.

Eager's backward reads such a tensor when backward runs: rebinding the name, replacing the
attribute or writing into the tensor between forward and ``.backward()`` changes the gradient.
Each case runs the same script of calls (state set before forward, changed before backward)
eagerly, through ``minihop.function`` (strict), ``minihop.apply`` and
``minihop.function(F, fallback="eager")``, and compares outputs, every ``.grad`` and the
tensors' own ``.grad`` after each call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop

import eager_modes  # tests/ is on the path (pytest prepends a test file's directory)

MODES = eager_modes.MODES
_caller = eager_modes.caller
_same = eager_modes.same


def _check(fn: type, script: Callable[[Callable[..., Any]], list[Any]], reset: Callable[[], None]) -> None:
    """``script(call)`` run eagerly and in every mode, from the same state, gives the same record."""
    reset()
    expected = script(_caller("eager", fn))
    for mode in MODES:
        minihop.reset()
        reset()
        _same(expected, script(_caller(mode, fn)), mode)


def _calls(before_forward: Callable[[int], None], before_backward: Callable[[int], None],
           watched: Callable[[], list[Any]] = list, n: int = 3,
           create_graph: bool = False) -> Callable[[Callable[..., Any]], list[Any]]:
    """``n`` calls: state set before each forward and changed before each backward; records the
    output, x.grad and the ``.grad`` of what ``watched`` returns (tensors that may require grad)."""
    def script(call: Callable[..., Any]) -> list[Any]:
        record: list[Any] = []
        for k in range(n):
            before_forward(k)
            x = torch.arange(1.0, 3.0).requires_grad_()
            y = call(x)
            before_backward(k)
            if create_graph:
                (gx,) = torch.autograd.grad((y * y).sum(), x, create_graph=True)
                record.append(gx.detach())
                gx.sum().backward()
            else:
                y.sum().backward()
            record += [y.detach(), x.grad, [None if t.grad is None else t.grad.clone() for t in watched()]]
        return record
    return script


# -- a rebound global -------------------------------------------------------------------

W = torch.tensor([1.0, 2.0])


def _reset_w() -> None:
    global W
    W = torch.tensor([1.0, 2.0])


def _set_w(value: torch.Tensor) -> None:
    global W
    W = value


class GlobalInBackward(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * W


class GlobalInBoth(Function):
    @staticmethod
    def forward(ctx, x):
        return x * W

    @staticmethod
    def backward(ctx, g):
        return g * W


class GlobalSavedAndRead(Function):
    """Saves W (forward's) and reads the global W too (backward's): two different tensors."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(W)
        return x * W

    @staticmethod
    def backward(ctx, g):
        (w_then,) = ctx.saved_tensors
        return g * w_then + g * W


class GlobalOnCtx(Function):
    """Keeps forward's W on ctx: backward's ``ctx.w`` is forward's tensor, not the global's."""

    @staticmethod
    def forward(ctx, x):
        ctx.w = W
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * ctx.w


@pytest.mark.parametrize("fn", [GlobalInBackward, GlobalInBoth, GlobalSavedAndRead, GlobalOnCtx])
def test_global_rebound_between_forward_and_backward(fn: type) -> None:
    """Backward uses the tensor the global holds when backward runs; forward the one it held then."""
    _check(fn, _calls(lambda k: _set_w(torch.tensor([1.0, 2.0]) + k),
                      lambda k: _set_w(torch.tensor([5.0, 6.0]) * (k + 1))), _reset_w)


@pytest.mark.parametrize("fn", [GlobalInBackward, GlobalInBoth, GlobalSavedAndRead])
def test_global_written_in_place_between_forward_and_backward(fn: type) -> None:
    """An in-place write into the global's tensor is seen by backward (no version error: the
    user never saved it through save_for_backward... except GlobalSavedAndRead, which eager
    refuses as minihop must)."""
    def write(k: int) -> None:
        W.mul_(3)

    if fn is GlobalSavedAndRead:
        for mode in ("eager", *MODES):
            minihop.reset()
            _reset_w()
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                _calls(lambda k: None, write)(_caller(mode, fn))
        return
    _check(fn, _calls(lambda k: None, write), _reset_w)


@pytest.mark.parametrize("new", [torch.tensor([3.0]), torch.tensor(4.0), torch.tensor([1.5, 2.5], dtype=torch.float64),
                                 torch.tensor([[1.0, 2.0], [3.0, 4.0]])],
                         ids=["shape1", "scalar", "float64", "2x2"])
def test_global_rebound_to_another_shape_or_dtype(new: torch.Tensor) -> None:
    """A tensor of other properties before backward: eager's result (or eager's error)."""
    def script(call: Callable[..., Any]) -> list[Any]:
        try:
            return _calls(lambda k: _set_w(torch.tensor([1.0, 2.0])), lambda k: _set_w(new.clone()))(call)
        except RuntimeError as e:
            return ["raised", type(e)]

    _check(GlobalInBackward, script, _reset_w)
    _check(GlobalInBoth, script, _reset_w)


def test_global_that_requires_grad() -> None:
    """Backward's ``g * W`` runs under no-grad: W.grad stays None, as in eager."""
    def rebind(k: int) -> None:
        _set_w(torch.tensor([2.0, 3.0]).requires_grad_())

    _check(GlobalInBackward, _calls(rebind, rebind, watched=lambda: [W]), _reset_w)
    _check(GlobalInBoth, _calls(rebind, rebind, watched=lambda: [W]), _reset_w)


def test_global_read_by_backward_under_create_graph() -> None:
    """create_graph=True: backward's ``g * W`` is recorded, so W (requiring grad) gets a grad
    from the double backward, the W backward read."""
    kept: list[torch.Tensor] = []

    def rebind(k: int) -> None:
        _set_w(torch.tensor([2.0, 3.0 + k]).requires_grad_())
        kept.append(W)

    def reset() -> None:
        _reset_w()
        kept.clear()

    _check(GlobalInBackward, _calls(rebind, rebind, watched=lambda: list(kept), create_graph=True), reset)
    _check(GlobalInBoth, _calls(rebind, rebind, watched=lambda: list(kept), create_graph=True), reset)


# -- a closure cell, a class attribute, a module's buffer ----------------------------------

def _closure_function() -> tuple[type, Callable[[torch.Tensor], None]]:
    w = torch.tensor([1.0, 2.0])

    def set_w(value: torch.Tensor) -> None:
        nonlocal w
        w = value

    class ClosureInBackward(Function):
        @staticmethod
        def forward(ctx, x):
            return x * w

        @staticmethod
        def backward(ctx, g):
            return g * w

    return ClosureInBackward, set_w


def test_closure_cell_rebound_between_forward_and_backward() -> None:
    fn, set_w = _closure_function()
    _check(fn, _calls(lambda k: set_w(torch.tensor([1.0, 2.0]) - k), lambda k: set_w(torch.tensor([7.0, 8.0]) + k)),
           lambda: set_w(torch.tensor([1.0, 2.0])))


class ClassAttribute(Function):
    W = torch.tensor([1.0, 2.0])

    @staticmethod
    def forward(ctx, x):
        return x + 1

    @staticmethod
    def backward(ctx, g):
        return g * ClassAttribute.W


class Holder:
    W = torch.tensor([1.0, 2.0])


class HolderAttribute(Function):
    @staticmethod
    def forward(ctx, x):
        return x * Holder.W

    @staticmethod
    def backward(ctx, g):
        return g * Holder.W


def test_class_attribute_replaced_between_forward_and_backward() -> None:
    def set_attr(cls: type, value: torch.Tensor) -> None:
        cls.W = value

    def reset() -> None:
        ClassAttribute.W = torch.tensor([1.0, 2.0])
        Holder.W = torch.tensor([1.0, 2.0])

    _check(ClassAttribute, _calls(lambda k: set_attr(ClassAttribute, torch.tensor([1.0, 2.0]) * k),
                                  lambda k: set_attr(ClassAttribute, torch.tensor([9.0, 3.0]) + k)), reset)
    _check(HolderAttribute, _calls(lambda k: set_attr(Holder, torch.tensor([1.0, 2.0]) * k),
                                   lambda k: set_attr(Holder, torch.tensor([9.0, 3.0]) + k)), reset)


class Scaler(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.tensor([1.0, 2.0]))


MOD = Scaler()


class ModuleBuffer(Function):
    @staticmethod
    def forward(ctx, x):
        return x * MOD.scale

    @staticmethod
    def backward(ctx, g):
        return g * MOD.scale


def test_module_buffer_replaced_or_written_between_forward_and_backward() -> None:
    """A global module's buffer: replaced, written in place, or the module itself rebound."""
    def reset() -> None:
        global MOD
        MOD = Scaler()

    def replace(k: int) -> None:
        MOD.scale = torch.tensor([4.0, 5.0]) + k

    def write(k: int) -> None:
        MOD.scale.add_(10.0)

    def rebind(k: int) -> None:
        global MOD
        MOD = Scaler()
        MOD.scale.fill_(-2.0 - k)

    for change in (replace, write, rebind):
        _check(ModuleBuffer, _calls(lambda k: None, change), reset)


def test_several_calls_before_one_backward() -> None:
    """Two forwards, then the global changes, then both backwards: each reads it then."""
    def script(call: Callable[..., Any]) -> list[Any]:
        _set_w(torch.tensor([1.0, 2.0]))
        xs = [torch.arange(1.0, 3.0).requires_grad_() for _ in range(2)]
        ys = [call(x) for x in xs]
        _set_w(torch.tensor([3.0, -1.0]))
        ys[0].sum().backward()
        _set_w(torch.tensor([0.5, 0.25]))
        ys[1].sum().backward()
        return [[y.detach() for y in ys], [x.grad for x in xs]]

    _check(GlobalInBoth, script, _reset_w)


def test_hot_path_unchanged_without_such_reads() -> None:
    """A Function whose backward reads only its saved values takes the simple backward (no
    fetch): its bwd code is called with the saved tensors directly."""
    class Plain(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin()

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x.cos()

    cap = minihop.capture(Plain, torch.ones(2, requires_grad=True))
    assert not any(s.read_in_backward for s in cap.inputs)
    assert not cap._function.backwards.needs_key


class ModuleArgument(Function):
    """A module passed as an argument, kept on ctx; backward reads its buffer then."""

    @staticmethod
    def forward(ctx, x, mod):
        ctx.mod = mod
        return x * mod.scale

    @staticmethod
    def backward(ctx, g):
        return g * ctx.mod.scale, None


def test_module_argument_buffer_replaced_between_forward_and_backward() -> None:
    """Backward reads ``ctx.mod.scale`` of the call's own module when it runs: replaced (same
    or other shape) or written in place before ``.backward()``, as in eager."""
    mods: list[Scaler] = []

    def script_for(change: Callable[[Scaler, int], None]) -> Callable[[Callable[..., Any]], list[Any]]:
        def script(call: Callable[..., Any]) -> list[Any]:
            record: list[Any] = []
            for k in range(3):
                mod = Scaler()
                x = torch.arange(1.0, 3.0).requires_grad_()
                y = call(x, mod)
                change(mod, k)
                try:
                    y.sum().backward()
                except RuntimeError as e:
                    record.append(type(e))
                    continue
                record += [y.detach(), x.grad]
            return record
        return script

    def replace(mod: Scaler, k: int) -> None:
        mod.scale = torch.tensor([4.0, 5.0]) + k

    def write(mod: Scaler, k: int) -> None:
        mod.scale.mul_(-1.0)

    def reshape(mod: Scaler, k: int) -> None:
        mod.scale = torch.tensor([3.0 + k])

    for change in (replace, write, reshape):
        _check(ModuleArgument, script_for(change), mods.clear)


def test_same_properties_take_the_traced_bwd() -> None:
    """A tensor rebound to one of the same properties is fetched, not traced again: one bwd."""
    minihop.reset()
    _reset_w()
    cap = minihop.capture(GlobalInBackward, torch.ones(2, requires_grad=True))
    for k in range(3):
        x = torch.ones(2, requires_grad=True)
        y = cap(x)
        _set_w(torch.tensor([5.0, 6.0]) + k)
        y.sum().backward()
        torch.testing.assert_close(x.grad, torch.tensor([5.0, 6.0]) + k)
    assert len(cap._function.backwards.variants) == 1
    y = cap(torch.ones(2, requires_grad=True))
    _set_w(torch.tensor([3.0]))  # another shape: a bwd traced for it
    y.sum().backward()
    assert len(cap._function.backwards.variants) == 2


# -- through the user's helpers: a partial, an object's method, an inner Function -------------

def _scaled_w(scale: float) -> torch.Tensor:
    return scale * W


SCALED_W = functools.partial(_scaled_w, 1.0)


class WReader:
    def read(self) -> torch.Tensor:
        return W


W_READER = WReader()


class InnerW(Function):
    @staticmethod
    def forward(ctx, t):
        return t * W

    @staticmethod
    def backward(ctx, g):
        return g * W


class ThroughPartial(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * SCALED_W()


class ThroughMethod(Function):
    @staticmethod
    def forward(ctx, x):
        return x * W_READER.read()

    @staticmethod
    def backward(ctx, g):
        return g * W_READER.read()


class ThroughInnerFunction(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * InnerW.apply(torch.ones(2))


@pytest.mark.parametrize("fn", [ThroughPartial, ThroughMethod, ThroughInnerFunction],
                         ids=["partial", "method", "inner Function"])
def test_global_read_through_a_helper_rebound_before_backward(fn: type) -> None:
    """The global is named by a helper backward calls, not by backward itself (found by
    generate_reads: the trace held forward's tensor, in every mode)."""
    _check(fn, _calls(lambda k: _set_w(torch.tensor([1.0, 2.0]) * (k + 1)),
                      lambda k: _set_w(torch.tensor([-3.0, 0.5]) * (k + 2))), _reset_w)


FLIP = [False]


class FlagThenInner(Function):
    """A flag flipped before backward retraces it; the retrace meets the global again."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        out = g * InnerW.apply(torch.ones(2))
        return out * 2 if FLIP[0] else out


def test_a_backward_traced_again_reads_a_rebound_global_through_an_inner_function() -> None:
    def flip(k: int) -> None:
        FLIP[0] = k % 2 == 1
        _set_w(torch.tensor([2.0, -1.0]) * (k + 1))

    def reset() -> None:
        FLIP[0] = False
        _reset_w()

    _check(FlagThenInner, _calls(lambda k: FLIP.__setitem__(0, False), flip), reset)


W_OTHER = torch.tensor([3.0, 4.0])


class OtherWeightOnFlag(Function):
    """A flag flipped before backward picks another global weight than the captured backward read."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * (W_OTHER if FLIP[0] else W)


def test_a_flag_flipped_before_backward_reads_a_global_the_captured_backward_did_not() -> None:
    def before_backward(k: int) -> None:
        global W_OTHER
        FLIP[0] = k == 1
        W_OTHER = torch.tensor([5.0, 6.0]) * k

    def reset() -> None:
        global W_OTHER
        FLIP[0] = False
        W_OTHER = torch.tensor([3.0, 4.0])
        _reset_w()

    _check(OtherWeightOnFlag, _calls(lambda k: FLIP.__setitem__(0, False), before_backward), reset)
