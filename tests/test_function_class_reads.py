"""What a Function class holds, read through the class (``MyFn.drop(x)``, ``impl.SCALE``).

A Function class's key was its methods only; its other attributes were read places where a
chain named them from a global or cell. Read any other way they were not guarded, and a
changed value was read as the captured one, with no error: a module kept on the class and
called as a method (``MyFn.drop(x)``, the chain's place being the class), a Function class
passed in (``impl.SCALE``, ``impl.drop(x)``) or kept in an argument, a Function class reached
through a local alias and ``getattr``, or held in a dict a helper is handed. Now a Function
class's key holds its other attributes too (``runtime.guards.function_class_state``), and a
chain from an argument through a Function class is a read place of its own
(``tracer.method_reads.through_function_class``). Each case against eager in strict, apply and
fallback mode.
"""

from __future__ import annotations

import functools
import types

import pytest
import torch
from torch import nn

import minihop
from eager_modes import matches_eager
from minihop.errors import GuardMismatchError


def _x(i: int) -> torch.Tensor:
    return (torch.linspace(-1, 1, 4) + i).requires_grad_()


class Impl(torch.autograd.Function):
    """A Function written at module level, as users write them: its methods name it as a global."""

    SCALE = 2.0
    drop = nn.Dropout(0.5)

    @staticmethod
    def forward(ctx, x):
        return x * Impl.SCALE

    @staticmethod
    def backward(ctx, g):
        return g * Impl.SCALE


@pytest.fixture(autouse=True)
def _impl_as_written():
    yield
    Impl.SCALE = 2.0
    Impl.drop.train()


def test_a_module_kept_on_the_function_class_and_called_through_it():
    class Dropped(torch.autograd.Function):
        drop = nn.Dropout(0.5)

        @staticmethod
        def forward(ctx, x):
            return Dropped.drop(x)

        @staticmethod
        def backward(ctx, g):
            return g
    matches_eager(Dropped, lambda i: (_x(i),), between=lambda i: Dropped.drop.train(i % 2 == 0),
                  reset=lambda: Dropped.drop.train(), refusable=False)


def test_a_function_class_passed_in_is_read_through():

    class Outer(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, impl):
            return impl.drop(x) * impl.SCALE

        @staticmethod
        def backward(ctx, g):
            return g, None

    def between(i):
        Impl.SCALE = 2.0 + i // 2
        Impl.drop.train(i % 2 == 1)

    def reset():
        Impl.SCALE = 2.0
        Impl.drop.train()
    matches_eager(Outer, lambda i: (_x(i), Impl), between=between, reset=reset, refusable=False, steps=6)


def test_a_function_class_in_an_argument_object_and_list():
    cfg = types.SimpleNamespace(impl=Impl)

    class Outer(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, c, impls):
            return x * c.impl.SCALE + impls[0].SCALE

        @staticmethod
        def backward(ctx, g):
            return g, None, None
    matches_eager(Outer, lambda i: (_x(i), cfg, [Impl]), between=lambda i: setattr(Impl, "SCALE", 2.0 + i),
                  reset=lambda: setattr(Impl, "SCALE", 2.0), refusable=False)


def test_a_function_class_in_a_global_dict_handed_to_a_helper():
    REGISTRY = {"impl": Impl}

    def scale_in(registry):
        return registry["impl"].SCALE

    class Outer(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * scale_in(REGISTRY)

        @staticmethod
        def backward(ctx, g):
            return g
    matches_eager(Outer, lambda i: (_x(i),), between=lambda i: setattr(Impl, "SCALE", 2.0 + i),
                  reset=lambda: setattr(Impl, "SCALE", 2.0))


def test_the_function_itself_through_a_local_alias_and_getattr():
    class Scaled(torch.autograd.Function):
        SCALE = 2.0

        @staticmethod
        def forward(ctx, x):
            me = Scaled
            return x * getattr(me, "SCALE")

        @staticmethod
        def backward(ctx, g):
            return g
    matches_eager(Scaled, lambda i: (_x(i),), between=lambda i: setattr(Scaled, "SCALE", 2.0 + i),
                  reset=lambda: setattr(Scaled, "SCALE", 2.0))


def test_a_library_function_or_partial_kept_on_the_class():
    class Act(torch.autograd.Function):
        act = staticmethod(torch.relu)
        shift = functools.partial(torch.add, other=1.0)

        @staticmethod
        def forward(ctx, x):
            return Act.shift(Act.act(x))

        @staticmethod
        def backward(ctx, g):
            return g

    def between(i):
        Act.act = staticmethod((torch.relu, torch.tanh)[i % 2])
        Act.shift.keywords["other"] = 1.0 + i

    def reset():
        Act.act = staticmethod(torch.relu)
        Act.shift.keywords["other"] = 1.0
    matches_eager(Act, lambda i: (_x(i),), between=between, reset=reset, refusable=False)


def test_a_counter_on_the_class_beside_a_read_through_it():
    # (the class's key holds ``calls``, which every call changes: sound, captured again)
    class Counted(torch.autograd.Function):
        calls = 0
        drop = nn.Dropout(0.0)

        @staticmethod
        def forward(ctx, x):
            Counted.calls += 1
            return Counted.drop(x) * Counted.calls

        @staticmethod
        def backward(ctx, g):
            return g
    matches_eager(Counted, lambda i: (_x(i),), reset=lambda: setattr(Counted, "calls", 0),
                  state=lambda: Counted.calls)


def test_a_direct_capture_names_the_changed_class_attribute():

    class Outer(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, impl):
            return x * impl.SCALE

        @staticmethod
        def backward(ctx, g):
            return g, None
    x = _x(0)
    cap = minihop.capture(Outer, x, Impl)
    torch.testing.assert_close(cap(x, Impl), x * 2.0)
    Impl.SCALE = 3.0
    with pytest.raises(GuardMismatchError, match="SCALE"):
        cap(x, Impl)


def test_a_function_class_that_holds_itself():
    # (a registry pattern: ``MyFn.me = MyFn``; the key of its own attribute is a cycle mark)
    class Registered(torch.autograd.Function):
        SCALE = 2.0

        @staticmethod
        def forward(ctx, x):
            return x * Registered.me.SCALE

        @staticmethod
        def backward(ctx, g):
            return g
    Registered.me = Registered
    matches_eager(Registered, lambda i: (_x(i),), between=lambda i: setattr(Registered, "SCALE", 2.0 + i),
                  reset=lambda: setattr(Registered, "SCALE", 2.0), refusable=False)


    class Takes(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, impl):
            return x * impl.me.SCALE

        @staticmethod
        def backward(ctx, g):
            return g, None
    x = _x(0)
    cap = minihop.capture(Takes, x, Registered)
    Registered.SCALE = 3.0
    try:
        with pytest.raises(GuardMismatchError, match="SCALE"):
            cap(x, Registered)
    finally:
        Registered.SCALE = 2.0


# An inner Function's class, checked on every call by identity (``guard_checks.class_watch``)
# rather than by rebuilding its key: each way its state changes must still be seen.

class _Base(torch.autograd.Function):
    TABLE = [2.0]

    @staticmethod
    def scale(x):
        return x * 2.0


class _Inner(_Base):
    SCALE = 2.0

    @staticmethod
    def forward(ctx, x):
        return _Inner.scale(x) * _Inner.SCALE * _Inner.TABLE[0]

    @staticmethod
    def backward(ctx, g):
        return g * 4.0 * _Inner.SCALE


class _Calls(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _Inner.apply(x).sin()

    @staticmethod
    def backward(ctx, g):
        return g


def _scale_by_three(x):
    return x * 3.0


def _watched_state():
    yield
    _Inner.SCALE = 2.0
    _Base.TABLE[:] = [2.0]
    _Base.scale = staticmethod(lambda x: x * 2.0)
    for name in ("EXTRA", "OTHER"):
        for cls in (_Inner, _Base):
            if name in vars(cls):
                delattr(cls, name)


_CHANGES = {
    "a number rebound": lambda i: setattr(_Inner, "SCALE", 2.0 + i % 2),
    "a list on a base changed in place": lambda i: _Base.TABLE.__setitem__(0, 2.0 + i % 2),
    "a base's helper rebound": lambda i: setattr(_Base, "scale", staticmethod(_scale_by_three if i % 2 else (lambda x: x * 2.0))),
    "a helper's code replaced": lambda i: setattr(vars(_Base)["scale"].__func__, "__code__",
                                                  (_scale_by_three if i % 2 else (lambda x: x * 2.0)).__code__),
    "one attribute removed, another added": lambda i: _swap("EXTRA" if i % 2 else "OTHER", "OTHER" if i % 2 else "EXTRA"),
}


def _swap(new, old):
    # (the class keeps as many attributes, one of them another name)
    setattr(_Inner, new, 1.0)
    if old in vars(_Inner):
        delattr(_Inner, old)


@pytest.mark.parametrize("change", sorted(_CHANGES))
def test_an_inner_function_class_changed_between_calls(change):
    state = _watched_state()
    next(state)
    try:
        matches_eager(_Calls, lambda i: (_x(i),), between=_CHANGES[change], reset=lambda: next(_watched_state()), refusable=False)
    finally:
        next(state, None)


def test_the_identity_watch_never_accepts_a_changed_class_state():
    from minihop.runtime.guard_checks import class_watch
    from minihop.runtime.guards import FN_OWN, function_class_state
    state = _watched_state()
    next(state)
    try:
        for name, change in sorted(_CHANGES.items()):
            for i in (1, 2, 3):
                before = function_class_state(_Inner)
                watch = class_watch(_Inner, before, FN_OWN)
                assert watch is not None and watch(_Inner), name
                change(i)
                changed = function_class_state(_Inner) != before
                assert watch(_Inner) is not changed, (name, i)
        bases = class_watch(_Inner, function_class_state(_Inner), FN_OWN)
        _Inner.__bases__ = (type("_Other", (_Base,), {"TABLE": [5.0]}),)
        assert not bases(_Inner)
    finally:
        _Inner.__bases__ = (_Base,)
        next(state, None)
