"""Hostile spellings, round 6: Python state written and read the ways users write it, tried
from outside while the heap watch became one (``tracer/outside.py`` claiming from its diff).

Each was a silent difference from eager (or a fake tensor left in the caller's state) before
this round, in strict and in fallback mode, unless said:

- a counter and a tensor set on the same argument object (``s.count += 1; s.cache = y``): the
  counter was repeated as the traced value, not as an increment (``outside.claim`` now takes
  only the entries holding the tensor; the counter is the rule table's);
- ``object.__setattr__`` on a frozen dataclass: the replayed write went through its
  ``__setattr__`` and raised (``Place.set`` writes as the heap watch puts back);
- ``global G; G = y`` and ``nonlocal cache; cache = y`` where the code never reads the name:
  not a root of the heap watch, so the fake tensor stayed there (and ``N = 5`` was made once);
- a tensor argument's own attribute read by backward off ``ctx.saved_tensors``, changed
  between forward and ``.backward()``: backward used the traced value.

Each runs against eager in strict, apply and fallback mode (``eager_modes.matches_eager``).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from eager_modes import matches_eager


def x_(i):
    return (torch.linspace(-1, 1, 4) + i).requires_grad_()


def _detached(value):
    return value.detach() if isinstance(value, torch.Tensor) else value


class Slotted:
    __slots__ = ("count", "cache")

    def __init__(self):
        self.count = 0
        self.cache = None


class Plain:
    def __init__(self):
        self.count = 0
        self.cache = None


@pytest.mark.parametrize("holder", [Plain, Slotted])
def test_counter_beside_a_tensor_on_the_same_object(holder) -> None:
    """``s.count += 1; s.cache = y`` on one argument object: the counter is an increment each
    call (it was repeated as the traced value: the whole object was the tensor write's), the
    tensor this call's."""
    box = {}

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, s):
            s.count += 1
            s.cache = x * 2
            return x * 3

        @staticmethod
        def backward(ctx, g):
            return g * 3, None

    def reset():
        box["s"] = holder()

    matches_eager(F, lambda i: (x_(i), box["s"]), reset=reset,
                  state=lambda: (box["s"].count, _detached(box["s"].cache)), refusable=False)


@dataclasses.dataclass(frozen=True)
class Frozen:
    scale: float = 2.0


def test_object_setattr_on_a_frozen_dataclass() -> None:
    """``object.__setattr__`` past a frozen dataclass's ``__setattr__``: replayed the same way."""
    box = {}

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, f):
            object.__setattr__(f, "scale", f.scale + 1)
            return x * f.scale

        @staticmethod
        def backward(ctx, g):
            return g, None

    def reset():
        box["f"] = Frozen()

    matches_eager(F, lambda i: (x_(i), box["f"]), reset=reset, state=lambda: box["f"].scale)


class Prop:
    def __init__(self):
        self._v = 1.0

    @property
    def v(self):
        return self._v

    @v.setter
    def v(self, val):
        self._v = val


PROP = Prop()


def test_a_global_property_setter() -> None:
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            PROP.v = PROP.v * 2
            return x * PROP.v

        @staticmethod
        def backward(ctx, g):
            return g

    def reset():
        PROP._v = 1.0

    matches_eager(F, lambda i: (x_(i),), reset=reset, state=lambda: PROP._v)


class Counted:
    count = 0

    def bump(self):
        type(self).count += 1
        return type(self).count


def test_a_class_counter_through_an_argument_method() -> None:
    """``type(self).count += 1`` in a method of an argument object."""
    box = {}

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, obj):
            return x * obj.bump()

        @staticmethod
        def backward(ctx, g):
            return g, None

    def reset():
        Counted.count = 0
        box["o"] = Counted()

    matches_eager(F, lambda i: (x_(i), box["o"]), reset=reset, state=lambda: Counted.count)


class Bag:
    pass


def _bag_state(bag: Bag) -> list:
    return sorted((k, v.detach().tolist() if isinstance(v, torch.Tensor) else v) for k, v in vars(bag).items())


def test_setattr_with_a_variable_name_and_a_tensor_through_dict() -> None:
    """``setattr(bag, name, ...)`` with the name an argument, and ``bag.__dict__["cache"] = y``."""
    box = {}
    names = ["a", "b", "a", "c"]

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, bag, name):
            setattr(bag, name, getattr(bag, name, 0) + 1)
            bag.__dict__["cache"] = x * 2
            return x * 3

        @staticmethod
        def backward(ctx, g):
            return g * 3, None, None

    def reset():
        box["b"] = Bag()

    matches_eager(F, lambda i: (x_(i), box["b"], names[i]), reset=reset, state=lambda: _bag_state(box["b"]))


def test_vars_update() -> None:
    """``vars(bag).update(...)``: library code writing the object's dict."""
    box = {}

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, bag):
            vars(bag).update(n=getattr(bag, "n", 0) + 1, last=1.0)
            return x * bag.n

        @staticmethod
        def backward(ctx, g):
            return g, None

    def reset():
        box["b"] = Bag()

    matches_eager(F, lambda i: (x_(i), box["b"]), reset=reset, state=lambda: _bag_state(box["b"]))


def test_a_tensor_stored_into_a_closure_variable_only() -> None:
    """``nonlocal cache; cache = y`` with no read of ``cache``: a root of the heap watch (the fake
    tensor stayed there, in both modes); a tensor there is refused (MH106), fallback runs eagerly."""
    cache = None

    def get():
        return cache

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            nonlocal cache
            cache = x * 2
            return x * 3

        @staticmethod
        def backward(ctx, g):
            return g * 3

    def reset():
        nonlocal cache
        cache = None

    matches_eager(F, lambda i: (x_(i),), reset=reset, state=lambda: _detached(get()))


def test_a_private_counter_and_tensor_on_a_global_module() -> None:
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self._cache = None
            self._n = 0

    m = M()

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            m._n += 1
            m._cache = x.detach() * m._n
            return x * 3

        @staticmethod
        def backward(ctx, g):
            return g * 3

    def reset():
        m._cache, m._n = None, 0

    matches_eager(F, lambda i: (x_(i),), reset=reset, state=lambda: (m._n, _detached(m._cache)), refusable=False)


def test_a_tensor_arguments_attribute_read_by_backward_and_changed_before_it() -> None:
    """Backward reads ``x.scale`` off ``ctx.saved_tensors``; the caller changes it between
    forward and ``.backward()``: eager's backward reads the new value."""

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * getattr(x, "scale", 1.0)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * getattr(x, "scale", 1.0)

    xs = []

    def make(i):
        t = x_(i)
        t.scale = 2.0 + i
        if i % 2:
            t.note = "odd"  # (another attribute beside it)
        xs.append(t)
        return (t,)

    def mid(i):
        if i == 2:
            xs[-1].scale = 9.0

    matches_eager(F, make, mid=mid, reset=xs.clear)


STORED = None
COUNT_SET = 0


@pytest.mark.parametrize("what", ["tensor", "int"])
def test_a_global_the_code_only_stores_to(what: str) -> None:
    """``global G; G = y`` with no read of G: a root of the heap watch all the same."""

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            global STORED, COUNT_SET
            if what == "tensor":
                STORED = x * 2
            else:
                COUNT_SET = 5
            return x * 3

        @staticmethod
        def backward(ctx, g):
            return g * 3

    def reset():
        global STORED, COUNT_SET
        STORED, COUNT_SET = None, 0

    def between(i):
        global COUNT_SET
        COUNT_SET = 0  # the caller clears it: each call sets it again, as eager's does

    matches_eager(F, lambda i: (x_(i),), reset=reset, between=between,
                  state=lambda: (COUNT_SET, None if STORED is None else STORED.detach()), refusable=False)
    reset()


def test_a_closure_variable_the_code_only_stores_to() -> None:
    """``nonlocal n; n = 5`` with no read of n: replayed each call."""
    n = 0

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            nonlocal n
            n = 5
            return x * 3

        @staticmethod
        def backward(ctx, g):
            return g * 3

    def reset():
        nonlocal n
        n = 0

    def between(i):
        nonlocal n
        n = 0

    matches_eager(F, lambda i: (x_(i),), reset=reset, between=between, state=lambda: n, refusable=False)


ITEMS = [0]


def test_a_refused_item_replacement_names_the_container() -> None:
    """``ITEMS[0] += 1`` replaces a list item (not a counter minihop repeats): the refusal names
    ``ITEMS``, not ``ITEMS[None]`` (the heap's step for a changed whole)."""
    import minihop
    from minihop.errors import SideEffectError

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ITEMS[0] += 1
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    with pytest.raises(SideEffectError) as info:
        minihop.function(F)(torch.ones(2))
    assert str(info.value).splitlines()[0].endswith("F.forward changes ITEMS, Python state it did not create."), info.value
    assert ITEMS == [0]  # put back


@pytest.mark.parametrize("sizes_change", [False, True])
@pytest.mark.parametrize("saved", ["output", "intermediate"])
@pytest.mark.parametrize("read", ["getattr with a default", "plain attribute"])
def test_an_attribute_on_a_saved_tensor_read_by_backward(saved: str, read: str, sizes_change: bool) -> None:
    """Eager's backward gets a saved *output* back as a new tensor object, without the
    attributes forward set on it (``y.n`` is an ``AttributeError`` there); an intermediate
    comes back as itself, attributes and all. The trace kept forward's fake with ``n`` for
    both: backward used 3.0 where eager used its default, or ran where eager raised."""

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x * 2
            z = x * 3
            (y if saved == "output" else z).n = 3.0
            ctx.save_for_backward(y if saved == "output" else z)
            return y

        @staticmethod
        def backward(ctx, g):
            (t,) = ctx.saved_tensors
            return g * (getattr(t, "n", 1.0) if read == "getattr with a default" else t.n)

    matches_eager(F, lambda i: (torch.ones(2 + (i if sizes_change else 0), requires_grad=True),), steps=4)


HISTORY: list = []


@pytest.mark.parametrize("when", [1, 2])
def test_a_global_history_the_caller_pops_before_backward(when: int) -> None:
    """Forward appends to a global list, backward reads its last item, and the caller pops
    between forward and ``.backward()``: backward reads the item before, as eager's does. The
    backward traced again for that call lifted the item by a route found at capture (its
    position in the longer list), which led nowhere once the list was shorter: ``None`` went
    into the graph (a TypeError in strict and in fallback mode alike)."""

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            HISTORY.append(x.detach() * 2)
            return x * 3

        @staticmethod
        def backward(ctx, g):
            return g * (HISTORY[-1] if HISTORY else 1.0)

    def mid(i):
        if i == when:
            HISTORY.pop()

    matches_eager(F, lambda i: ((torch.ones(3) * (i + 1)).requires_grad_(),), mid=mid, reset=HISTORY.clear,
                  state=lambda: [h.clone() for h in HISTORY])
    HISTORY.clear()
