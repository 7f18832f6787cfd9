"""Identity reads: code that asks which object a value is (issue 28, round 7 from outside).

A capture is traced on a fake copy of each tensor argument, and the call key holds tensors by
their properties and objects by their contents. Where the code compared identities, the trace
answered with the fake's, or a later call with another object of the same properties reused
it. Each case below was a silent difference from eager, in strict and in fallback mode, before
``tracer/identity.py``:

- ``w is W[0]``, ``any(w is t for t in PARAMS)``, ``D.get(w)`` on a dict keyed by tensors, a
  ``WeakKeyDictionary`` of tensors, ``w is m.weight`` of a module passed beside it: the trace's
  fake was never the caller's tensor (now refused, MH104, and a later call passing such a
  tensor never reuses a capture made without it);
- ``x is w`` and ``w is ws[0]`` for one tensor passed twice: the capture of one call served the
  other (which tensors of a call are one is part of its sharing now);
- ``CACHE[id(w)]``, ``hash(w)``, ``w.data_ptr()`` of a tensor argument: the fake's identity
  (refused, MH104);
- ``id(cfg)`` of an object argument keyed by its contents: another object with the same
  contents reused the first one's id (single-use now).

Each runs against eager in strict, apply and fallback mode (``eager_modes.matches_eager``).
"""

from __future__ import annotations

import inspect
import weakref

import pytest
import torch
from torch import nn

import minihop
from eager_modes import matches_eager

W = [torch.ones(4), torch.full((4,), 2.0)]


def x_(i):
    return (torch.linspace(-1, 1, 4) + i).requires_grad_()


def fresh(i):
    return torch.full((4,), float(i))


@pytest.mark.parametrize("calls", ["global first", "fresh first"])
def test_argument_compared_with_a_global_tensor(calls) -> None:
    """``w is W[0]``: eager answers True when the caller passes ``W[0]``."""

    class IsFirst(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            return x * (3 if w is W[0] else 5)

        @staticmethod
        def backward(ctx, g):
            return g, None

    if calls == "global first":
        matches_eager(IsFirst, lambda i: (x_(i), W[i % 2]))
    else:
        matches_eager(IsFirst, lambda i: (x_(i), W[0] if i >= 2 else fresh(i)))


def test_argument_among_a_global_list_of_tensors() -> None:
    """``any(w is t for t in PARAMS)``: a parameter list the Function checks membership in."""
    params = [torch.ones(4), torch.ones(4)]

    class Member(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            known = any(w is t for t in params)
            return x * (3 if known else 5)

        @staticmethod
        def backward(ctx, g):
            return g, None

    matches_eager(Member, lambda i: (x_(i), params[1] if i % 2 else fresh(i)))


def scaled_by(scales) -> type:
    """A Function scaling by ``scales.get(w, 5.0)``: a per-tensor table (an optimizer's state,
    a scale cache) looked up with its tensor argument."""

    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            return x * scales.get(w, 5.0)

        @staticmethod
        def backward(ctx, g):
            return g, None

    return Scaled


@pytest.mark.parametrize("holder", ["dict", "WeakKeyDictionary"])
def test_table_keyed_by_tensors_looked_up_with_an_argument(holder) -> None:
    scales = {W[0]: 3.0} if holder == "dict" else weakref.WeakKeyDictionary({W[0]: 3.0})
    matches_eager(scaled_by(scales), lambda i: (x_(i), W[i % 2]))


def test_id_of_a_tensor_argument_keys_a_cache() -> None:
    """``CACHE[id(w)]``: eager counts per tensor; the trace's id was the fake copy's."""
    counts: dict[int, float] = {}

    class Counted(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            key = id(w)
            counts[key] = counts.get(key, 1.0) + 1.0
            return x * counts[key]

        @staticmethod
        def backward(ctx, g):
            return g, None

    matches_eager(Counted, lambda i: (x_(i), W[i % 2]), state=lambda: sorted(counts.values()),
                  reset=counts.clear)


def test_hash_of_a_tensor_argument() -> None:
    class Hashed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            return x * (3 if hash(w) == hash(W[0]) else 5)

        @staticmethod
        def backward(ctx, g):
            return g, None

    matches_eager(Hashed, lambda i: (x_(i), W[i % 2]))


def test_data_ptr_of_a_tensor_argument() -> None:
    """``w.data_ptr() == W[0].data_ptr()``: a view of ``W[0]`` shares its storage in eager."""

    class SameStorage(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            return x * (2 if w.data_ptr() == W[0].data_ptr() else 3)

        @staticmethod
        def backward(ctx, g):
            return g, None

    matches_eager(SameStorage, lambda i: (x_(i), W[0][:] if i % 2 else fresh(i)))


def test_one_tensor_passed_twice() -> None:
    """``x is w``: the capture of ``F(a, b)`` served ``F(a, a)``."""

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            return x * (3 if x is w else 5)

        @staticmethod
        def backward(ctx, g):
            return g, g

    def args(i):
        a = x_(i)
        return (a, a) if i % 2 else (a, x_(i))

    matches_eager(Twice, args)


def test_tensor_in_a_list_argument_is_another_argument() -> None:
    class Listed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, ws):
            return x * (2 if any(w is t for t in ws) else 3)

        @staticmethod
        def backward(ctx, g):
            return g, None, None

    a, b = torch.ones(4), torch.ones(4)
    matches_eager(Listed, lambda i: (x_(i), a, [a] if i % 2 else [b]))


def test_parameter_of_a_module_argument_passed_beside_it() -> None:
    """``w is m.weight``: the module is kept as it is, its weight the caller's tensor."""
    lin = nn.Linear(4, 4)

    class Tied(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, m):
            return x * (2 if w is m.weight else 3)

        @staticmethod
        def backward(ctx, g):
            return g, None, None

    matches_eager(Tied, lambda i: (x_(i), lin.weight if i % 2 else torch.ones(4, 4), lin))


class Config:
    def __init__(self, scale: float) -> None:
        self.scale = scale


def test_id_of_an_object_argument_keyed_by_its_contents() -> None:
    """``SLOTS.setdefault(id(cfg), ...)``: two configs with equal contents are two objects."""
    configs = [Config(1.0), Config(1.0)]
    slots: dict[int, int] = {}

    class PerConfig(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, cfg):
            slots.setdefault(id(cfg), len(slots) + 2)
            return x * slots[id(cfg)] * cfg.scale

        @staticmethod
        def backward(ctx, g):
            return g, None

    matches_eager(PerConfig, lambda i: (x_(i), configs[i % 2]), state=lambda: sorted(slots.values()),
                  reset=slots.clear)


def _refusal(fn_cls, *args) -> str:
    with pytest.raises(minihop.MinihopError) as info:
        minihop.capture(fn_cls, *args)
    return str(info.value).splitlines()[0]


def test_refusals_name_the_argument_and_where_else_it_is() -> None:
    Scaled = scaled_by({W[0]: 3.0})

    class Keyed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            return x * (id(w) % 2)

        @staticmethod
        def backward(ctx, g):
            return g, None

    x = x_(0)
    assert _refusal(Scaled, x, W[0]).endswith(
        "Scaled is called with w, which is also a key of scales, a tensor its code can reach as the caller's.")
    line = inspect.getsourcelines(Keyed.forward)[1] + 2
    assert _refusal(Keyed, x, W[1]).endswith(f"Keyed calls id() of a tensor of the trace (line {line}).")


def test_id_of_an_object_is_named_as_why_the_capture_is_single_use() -> None:
    class PerConfig(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, cfg):
            return x * (id(cfg) % 2)

        @staticmethod
        def backward(ctx, g):
            return g, None

    text = str(minihop.explain(PerConfig, x_(0), Config(1.0)))
    assert "single-use" in text and "PerConfig calls id() of a Config object" in text


def test_hash_of_plain_values_keeps_the_capture_reusable() -> None:
    """``hash`` of a string or a tuple of numbers answers from the value: not single-use."""

    class Bucketed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, name, dims):
            return x * (1 + (hash((name, dims)) == hash(("a", (1, 2)))))

        @staticmethod
        def backward(ctx, g):
            return g, None, None

    f = minihop.function(Bucketed)
    for i in range(4):
        x = x_(i)
        f(x, "a", (1, 2)).sum().backward()
        e = x_(i)
        Bucketed.apply(e, "a", (1, 2)).sum().backward()
        assert torch.equal(x.grad, e.grad)
    assert (f.stats.captures, f.stats.hits) == (1, 3), f.stats


# -- type() of a tensor: the trace's fake is a FakeTensor, the caller's tensor a torch.Tensor --

@pytest.mark.parametrize("spelling", ["type", "my_type"])
def test_type_of_a_tensor_argument_is_torch_tensor(spelling) -> None:
    """``type(x) is torch.Tensor``: code that treats subclasses apart (it was ``FakeTensor``);
    by another name (``my_type = type`` at module level): refused (strict), eager (fallback)."""
    namespace = {"torch": torch, "my_type": my_type}
    exec(f"""
class PlainOnly(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * (2 if {spelling}(x) is torch.Tensor else 3)

    @staticmethod
    def backward(ctx, g):
        return g
""", namespace)
    matches_eager(namespace["PlainOnly"], lambda i: (x_(i),))


def test_type_of_a_parameter_argument() -> None:
    params = [nn.Parameter(torch.ones(4)), torch.ones(4)]

    class Kinds(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            return x * len(type(w).__name__)

        @staticmethod
        def backward(ctx, g):
            return g, None

    matches_eager(Kinds, lambda i: (x_(i), params[i % 2]))


def test_type_of_the_grad_in_backward_keys_a_table() -> None:
    scales = {torch.Tensor: 2.0}

    class ByType(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * scales.get(type(g), 3.0)

    matches_eager(ByType, lambda i: (x_(i),))


def test_type_still_makes_classes_and_checks_them() -> None:
    """Three-argument ``type`` and ``isinstance(C, type)`` in the traced code are ``type``'s."""

    class MakesOne(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            made = type("Made", (), {"k": 2.0})
            return x * made.k * (2 if isinstance(made, type) and type(made) is type else 3)

        @staticmethod
        def backward(ctx, g):
            return g * 4.0

    matches_eager(MakesOne, lambda i: (x_(i),))


# -- the same reads by other names, and a tensor argument held by an object argument --

my_id = id
my_type = type


@pytest.mark.parametrize("spelling", ["my_id(w)", "builtins.id(w)"])
def test_id_by_another_name_is_refused_not_baked(spelling) -> None:
    """``my_id = id`` at module level (or ``builtins.id``): the watch stands in for the name
    ``id`` only; another name would give the fake's id, so the call is refused (strict) and
    run eagerly (fallback)."""
    counts: dict[int, float] = {}
    namespace = {"torch": torch, "builtins": __import__("builtins"), "my_id": my_id, "counts": counts}
    exec(f"""
class Counted(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        key = {spelling}
        counts[key] = counts.get(key, 1.0) + 1.0
        return x * counts[key]

    @staticmethod
    def backward(ctx, g):
        return g, None
""", namespace)
    matches_eager(namespace["Counted"], lambda i: (x_(i), W[i % 2]), state=lambda: sorted(counts.values()),
                  reset=counts.clear)


class Holding:
    def __init__(self, w: torch.Tensor) -> None:
        self.w = w


def test_object_argument_holding_the_tensor_argument() -> None:
    """``cfg.w is w``: an object keyed by its contents, holding the very tensor passed beside it."""
    shared = torch.ones(4)

    class Held(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, cfg):
            return x * (2 if cfg.w is w else 3)

        @staticmethod
        def backward(ctx, g):
            return g, None, None

    matches_eager(Held, lambda i: (x_(i), shared, Holding(shared) if i % 2 else Holding(torch.ones(4))))


def test_records_with_outside_tensors_compare_without_comparing_tensors() -> None:
    """Two live weak references compare their tensors (elementwise: an error for more than one
    element); the record of the tensors reached outside is left out of ``PythonState``'s ``==``."""
    from minihop.spec import PythonState

    first, second = torch.ones(2), torch.zeros(2)
    assert PythonState(outside_tensors=(weakref.ref(first),)) == PythonState(outside_tensors=(weakref.ref(second),))
