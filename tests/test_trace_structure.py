"""``minihop.trace(fn, *args)(*args)`` returns what ``fn(*args)`` returns, built as ``fn`` built it.

Each case's ``fn`` applies a Function (``Sin``, or ``MulAdd`` with two outputs) through
``.apply`` and plain torch ops, and returns one structure: a single tensor, a tuple, a list, a
dict, a dataclass, a namedtuple, a nested mix, non-tensor leaves, an ``nn.Module``'s dict. The
traced module and eager run on twin copies of the arguments; the results must have the same
type at every level, the same values exactly (rtol=0, atol=0), the same ``requires_grad``, and
backward through every tensor leaf (each scaled by its own weight, then each leaf on its own)
must give every input eager's ``.grad``.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch
import torch.utils._pytree as pytree
from torch.autograd import Function

import minihop
from minihop.structure import attributes


class Sin(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return g * torch.cos(x)


class MulAdd(Function):
    """Two outputs, the second's grad routed differently from the first's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(x, y)
        return x * y, x + 2 * y

    @staticmethod
    def backward(ctx: Any, g_mul: torch.Tensor, g_add: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = ctx.saved_tensors
        return g_mul * y + g_add, g_mul * x + 2 * g_add


@dataclasses.dataclass
class Pair:
    first: torch.Tensor
    second: torch.Tensor


@dataclasses.dataclass(frozen=True)
class Frozen:
    value: torch.Tensor
    label: str


@dataclasses.dataclass
class WithTotal:
    """A field ``__post_init__`` computes: rebuilding by the constructor would redo it."""

    a: torch.Tensor
    b: torch.Tensor
    total: torch.Tensor = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.total = self.a * 3 + self.b


@dataclasses.dataclass
class Report:
    scores: dict[str, torch.Tensor]
    parts: list[Any]
    count: int


class Point(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


class Slotted:
    __slots__ = ("t", "n")

    def __init__(self, t: torch.Tensor, n: int) -> None:
        self.t, self.n = t, n


class Plain:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.tag = "plain"


class Color(enum.Enum):
    RED = 1
    BLUE = 2


CONFIG = Plain.__new__(Plain)  # a tensor-free object the function hands back as it is
CONFIG.__dict__.update(lr=0.1, name="cfg")


def r(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_()


# ---------------------------------------------------------------------------------------------
# The functions: each uses its arguments in order, so gm's inputs are (x, y) as fn's.
# ---------------------------------------------------------------------------------------------

def single_tensor(x: torch.Tensor, y: torch.Tensor) -> Any:
    return Sin.apply(x) * y


def a_tuple(x: torch.Tensor, y: torch.Tensor) -> Any:
    m, a = MulAdd.apply(x, y)
    return Sin.apply(m), a.cos()


def a_list(x: torch.Tensor, y: torch.Tensor) -> Any:
    m, a = MulAdd.apply(x, y)
    return [m, Sin.apply(a), m - a]


def a_dict(x: torch.Tensor, y: torch.Tensor) -> Any:
    m, a = MulAdd.apply(x, y)
    return {"out": Sin.apply(m) + a, "aux": a * 0.5}


def a_dataclass(x: torch.Tensor, y: torch.Tensor) -> Any:
    m, a = MulAdd.apply(x, y)
    return Pair(Sin.apply(m), a.exp())


def a_frozen_dataclass(x: torch.Tensor, y: torch.Tensor) -> Any:
    return Frozen(Sin.apply(x) + y, "frozen")


def a_post_init_dataclass(x: torch.Tensor, y: torch.Tensor) -> Any:
    return WithTotal(Sin.apply(x), y.tanh())


def a_namedtuple(x: torch.Tensor, y: torch.Tensor) -> Any:
    m, a = MulAdd.apply(x, y)
    return Point(Sin.apply(m), a)


def nested_mix(x: torch.Tensor, y: torch.Tensor) -> Any:
    m, a = MulAdd.apply(x, y)
    s = Sin.apply(m)
    return {"pair": Pair(s, [a, (s * a, Point(a.sin(), m))]),
            "list": [Report({"s": s.sum(), "a": a.mean(dim=0)}, [m * 2, (a,)], 2), (s - 1,)],
            "tuple": (Point(m.abs(), s), {"deep": [[a + s]]})}


def non_tensor_leaves(x: torch.Tensor, y: torch.Tensor) -> Any:
    m, a = MulAdd.apply(x, y)
    return (Sin.apply(m), 3, None, "name", 2.5, True, float("inf"), torch.float16, x.shape,
            {"n": 1, "t": a, "none": None}, [a * 2, -7, b"raw"], Color.BLUE, CONFIG)


def other_containers(x: torch.Tensor, y: torch.Tensor) -> Any:
    m, a = MulAdd.apply(x, y)
    s = Sin.apply(m)
    return (collections.OrderedDict(b=s, a=a), {Color.RED: s * 2, Color.BLUE: [a]},
            torch.max(s, dim=0), Slotted(a + 1, 4), Plain(s - a))


def same_tensor_twice_and_an_input(x: torch.Tensor, y: torch.Tensor) -> Any:
    s = Sin.apply(x) + y
    return {"s": s, "again": [s], "x": x}


FUNCTIONS: dict[str, Callable[..., Any]] = {f.__name__: f for f in (
    single_tensor, a_tuple, a_list, a_dict, a_dataclass, a_frozen_dataclass, a_post_init_dataclass,
    a_namedtuple, nested_mix, non_tensor_leaves, other_containers, same_tensor_twice_and_an_input)}


class DictModule(torch.nn.Module):
    """forward returns a dict: a Function on the input and the weight, a buffer, a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3, 4, generator=torch.Generator().manual_seed(9)))
        self.register_buffer("offset", torch.arange(4.0))

    def forward(self, x: torch.Tensor) -> Any:
        m, a = MulAdd.apply(x @ self.weight, self.offset + 1)
        return {"logits": Sin.apply(m), "extra": [a, self.weight.sum()], "layers": 2}


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def twin_args(*tensors: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    def copy() -> tuple[torch.Tensor, ...]:
        return tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in tensors)

    return copy(), copy()


def assert_same_structure(traced: Any, eager: Any, where: str = "output") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Same type at every level, same keys and constants, tensors exactly equal; the tensor pairs."""
    assert type(traced) is type(eager), f"{where}: {type(traced).__qualname__} != {type(eager).__qualname__}"
    if isinstance(eager, torch.Tensor):
        torch.testing.assert_close(traced, eager, rtol=0, atol=0, msg=lambda s: f"{where}: {s}")
        assert traced.requires_grad == eager.requires_grad, f"{where}: requires_grad"
        return [(traced, eager)]
    if isinstance(eager, (tuple, list)):
        assert len(traced) == len(eager), f"{where}: length"
        return [p for i, (t, e) in enumerate(zip(traced, eager, strict=True))
                for p in assert_same_structure(t, e, f"{where}[{i}]")]
    if isinstance(eager, dict):
        assert list(traced) == list(eager), f"{where}: keys"
        return [p for k in eager for p in assert_same_structure(traced[k], eager[k], f"{where}[{k!r}]")]
    if any(isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves(attributes(eager))):
        eager_attrs, traced_attrs = attributes(eager), attributes(traced)
        assert list(traced_attrs) == list(eager_attrs), f"{where}: attributes"
        return [p for k in eager_attrs
                for p in assert_same_structure(traced_attrs[k], eager_attrs[k], f"{where}.{k}")]
    assert traced == eager or (traced != traced and eager != eager), f"{where}: {traced!r} != {eager!r}"
    return []


def assert_grads_match(pairs: list[tuple[torch.Tensor, torch.Tensor]], traced_inputs: tuple[torch.Tensor, ...],
                       eager_inputs: tuple[torch.Tensor, ...]) -> None:
    """Each differentiable leaf on its own, then all of them with a weight each: eager's grads."""
    live = [(t, e) for t, e in pairs if e.requires_grad]
    assert live, "no output leaf requires grad: the test checks nothing"
    for i, (t, e) in enumerate(live):
        got = torch.autograd.grad(t.sum(), traced_inputs, retain_graph=True, allow_unused=True)
        want = torch.autograd.grad(e.sum(), eager_inputs, retain_graph=True, allow_unused=True)
        for j, (g, w) in enumerate(zip(got, want, strict=True)):
            assert (g is None) == (w is None), f"leaf {i}, input {j}: grad presence"
            if w is not None:
                torch.testing.assert_close(g, w, rtol=0, atol=0, msg=lambda s: f"leaf {i}, input {j}: {s}")
    sum(t.sum() * (k + 1) for k, (t, _) in enumerate(live)).backward()
    sum(e.sum() * (k + 1) for k, (_, e) in enumerate(live)).backward()
    for j, (t_in, e_in) in enumerate(zip(traced_inputs, eager_inputs, strict=True)):
        assert e_in.grad is not None, f"input {j}: eager gave no grad"
        torch.testing.assert_close(t_in.grad, e_in.grad, rtol=0, atol=0, msg=lambda s: f"input {j}: {s}")


def make_args() -> tuple[torch.Tensor, torch.Tensor]:
    return r(4, 3, seed=1), r(4, 3, seed=2)


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_structure_values_and_grads_match_eager(name: str) -> None:
    """gm(*args) is fn(*args): same type at every level, exact values, every input's grad through every leaf."""
    fn = FUNCTIONS[name]
    traced_args, eager_args = twin_args(*make_args())
    gm = minihop.trace(fn, *make_args())
    assert gm.meta["minihop_inputs"] == ["x", "y"]
    pairs = assert_same_structure(gm(*traced_args), fn(*eager_args))
    assert_grads_match(pairs, traced_args, eager_args)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_top_level_type_is_fns(name: str) -> None:
    """type(gm(*args)) is exactly type(fn(*args)): one tensor is a Tensor, not a 1-tuple."""
    fn = FUNCTIONS[name]
    args = make_args()
    assert type(minihop.trace(fn, *args)(*args)) is type(fn(*args))


def test_single_tensor_result_is_a_tensor() -> None:
    """The issue's case: gm(x, y).sum() works where fn(x, y).sum() does, and backward gives eager's grads."""
    (tx, ty), (ex, ey) = twin_args(*make_args())
    gm = minihop.trace(single_tensor, tx, ty)
    gm(tx, ty).sum().backward()
    single_tensor(ex, ey).sum().backward()
    torch.testing.assert_close(tx.grad, ex.grad, rtol=0, atol=0)
    torch.testing.assert_close(ty.grad, ey.grad, rtol=0, atol=0)


def test_module_forward_returning_a_dict() -> None:
    """An nn.Module's dict: same structure and values; the input and the weight get eager's grads."""
    module = DictModule()
    (tx,), (ex,) = twin_args(r(5, 3, seed=3))
    gm = minihop.trace(module, r(5, 3, seed=3))
    traced_out = gm(tx)
    pairs = assert_same_structure(traced_out, module(ex))
    module.zero_grad(set_to_none=True)
    live = [(t, e) for t, e in pairs if e.requires_grad]
    sum(e.sum() * (k + 1) for k, (_, e) in enumerate(live)).backward()
    eager_weight_grad = module.weight.grad.clone()
    module.zero_grad(set_to_none=True)
    sum(t.sum() * (k + 1) for k, (t, _) in enumerate(live)).backward()
    torch.testing.assert_close(tx.grad, ex.grad, rtol=0, atol=0)
    torch.testing.assert_close(module.weight.grad, eager_weight_grad, rtol=0, atol=0)
    assert traced_out["layers"] == 2 and type(traced_out["extra"]) is list


def test_containers_read_as_literals_in_the_code() -> None:
    """Tuples, lists and dicts are the output node's own containers: the code returns the literal (by hand)."""
    def fn(x: torch.Tensor) -> Any:
        s = Sin.apply(x)
        return {"s": s, "rest": [s * 2, None, "tag"], "pair": (s, 3)}

    gm = minihop.trace(fn, r(3, seed=4))
    assert gm.code.strip().splitlines()[-1].strip() == (
        "return {'s': getitem, 'rest': [mul, None, 'tag'], 'pair': (getitem, 3)}")
    single = minihop.trace(single_tensor, *make_args())
    assert single.code.strip().splitlines()[-1].strip() == "return mul"


def test_namedtuple_and_dataclass_are_built_by_one_call() -> None:
    """A namedtuple is its class called on the items; a dataclass one build_<Class> call; nothing is registered with pytree."""
    nodes_before = set(pytree.SUPPORTED_NODES)
    gm = minihop.trace(nested_mix, *make_args())
    assert set(pytree.SUPPORTED_NODES) == nodes_before
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert sum(n.target is Point for n in calls) == 2
    assert sorted(n.target.__name__ for n in calls if n.target.__name__.startswith("build_")) == [
        "build_Pair", "build_Report"]
    assert "build_Pair" in gm.code and "Point(" in gm.code


def test_post_init_is_not_run_again() -> None:
    """The traced object is copied, not constructed: __post_init__'s ops are graph ops, run once."""
    gm = minihop.trace(a_post_init_dataclass, *make_args())
    calls = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert WithTotal not in calls
    assert [getattr(t, "__name__", "") for t in calls].count("build_WithTotal") == 1


def test_identity_of_repeated_leaves_and_returned_input() -> None:
    """A tensor returned twice is one tensor twice, an input returned is the input, as in eager."""
    x, y = make_args()
    out = minihop.trace(same_tensor_twice_and_an_input, x, y)(x, y)
    assert out["again"][0] is out["s"]
    assert out["x"] is x


def test_tensor_free_constants_are_the_returned_objects() -> None:
    """A tensor-free object or enum the function returns comes back as that object."""
    args = make_args()
    out = minihop.trace(non_tensor_leaves, *args)(*args)
    assert out[-1] is CONFIG and out[-2] is Color.BLUE


def test_container_subclass_is_refused() -> None:
    """A tuple subclass that is no namedtuple: MH102 naming it, not a plain tuple back."""
    class Tagged(tuple):  # type: ignore[type-arg]
        pass

    def fn(x: torch.Tensor) -> Any:
        return Tagged((Sin.apply(x),))

    with pytest.raises(minihop.UnsupportedOutputError,
                       match=r"\[MH102\] The traced function returned a .*Tagged holding tensors, a subclass of tuple"):
        minihop.trace(fn, r(3, seed=5))
