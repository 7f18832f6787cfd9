"""Functions written the way outside code writes them, in spellings the other tests do not use.

Each case is a small Function of a class issue 28 names (callables and classes passed in,
float keys, attributes served by user code, iterators passed in, ...) spelled differently
from ``test_reads.py``'s: a staticmethod rebound on a class argument, a ``frozenset`` holding
``-0.0``, a descriptor counting its reads, a generator argument. Every case runs several calls,
changing the state between calls (``between``) and between forward and ``.backward()``
(``mid``), through eager ``F.apply``, ``minihop.function(F)``, ``minihop.apply`` and
``minihop.function(F, fallback="eager")``, and compares outputs (exact types), every
``.grad``, the Python state the case names (after forward and after backward) and eager's
exception if any. Strict mode may refuse with a coded ``MinihopError`` (then the fallback
must still equal eager); it may never differ.
"""

from __future__ import annotations

import contextvars
import functools
import sys
import itertools
import math
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop
from minihop.errors import MinihopError

import eager_modes  # tests/ is on the path (pytest prepends a test file's directory)


_norm = eager_modes.normalized
_same = eager_modes.same_normalized


def _run(call: Callable[..., Any], make_args: Callable[[int], tuple[Any, ...]], steps: int,
         between: Callable[[int], None], mid: Callable[[int], None],
         state: Callable[[], Any]) -> tuple[list[Any], bool]:
    """Per call: output, state after forward, grads, state after backward (or eager's
    exception type and phase). Returns (records, refused)."""
    records: list[Any] = []
    torch.manual_seed(0)
    for i in range(steps):
        between(i)
        args = make_args(i)
        phase = "forward"
        try:
            out = call(*args)
            after_forward = _norm(state())
            mid(i)
            phase = "backward"
            outs = out if isinstance(out, tuple) else (out,)
            loss = sum((o * (k + 1.5)).sum() for k, o in enumerate(outs)
                       if isinstance(o, torch.Tensor) and o.requires_grad)
            if isinstance(loss, torch.Tensor):
                loss.backward()
            records.append((_norm(out), after_forward,
                            _norm([a.grad for a in args if isinstance(a, torch.Tensor)]), _norm(state())))
        except MinihopError:
            return records, True
        except Exception as e:  # eager's own exception must be the capture's, in the same phase
            records.append((phase, type(e).__name__, _norm(state())))
    return records, False


def _matches_eager(fn_cls: type, make_args: Callable[[int], tuple[Any, ...]], *, steps: int = 4,
                   between: Callable[[int], None] = lambda i: None,
                   mid: Callable[[int], None] = lambda i: None,
                   state: Callable[[], Any] = lambda: None,
                   reset: Callable[[], None] = lambda: None, refusable: bool = True) -> None:
    reset()
    eager, _ = _run(fn_cls.apply, make_args, steps, between, mid, state)
    modes = {"strict": minihop.function(fn_cls), "apply": lambda *a: minihop.apply(fn_cls, *a),
             "fallback": minihop.function(fn_cls, fallback="eager")}
    for mode, call in modes.items():
        reset()
        got, refused = _run(call, make_args, steps, between, mid, state)
        assert not (refused and (mode == "fallback" or not refusable)), f"{mode} refused"
        n = len(got)
        assert _same(tuple(got), tuple(eager[:n])), f"{mode} differs from eager:\n{got}\n{eager[:n]}"


def _x(i: int) -> torch.Tensor:
    return torch.randn(3 + i % 2, 4).requires_grad_()


# -- callables and classes: code kept on a class is part of what the class is -------------------

def test_a_staticmethod_rebound_on_a_class_argument():
    class Ops:
        @staticmethod
        def act(t):
            return t.relu()

    class F(Function):
        @staticmethod
        def forward(ctx, t, ops):
            return ops.act(t).detach()

        @staticmethod
        def backward(ctx, g):
            return g, None

    def between(i):
        Ops.act = staticmethod([torch.relu, torch.tanh, torch.tanh, torch.sigmoid][i])

    _matches_eager(F, lambda i: (_x(i), Ops), between=between, refusable=False)


def test_a_classmethod_and_a_property_replaced_on_a_class_argument():
    class Cfg:
        @classmethod
        def scale(cls, t):
            return t * 2

        @property
        def unused(self):
            return 0

    class F(Function):
        @staticmethod
        def forward(ctx, t, cfg):
            return cfg.scale(t).detach()

        @staticmethod
        def backward(ctx, g):
            return g, None

    original = Cfg.__dict__["scale"]

    def between(i):
        if i == 2:
            Cfg.scale = classmethod(lambda cls, t: t * 5)

    _matches_eager(F, lambda i: (_x(i), Cfg), between=between, refusable=False,
                   reset=lambda: setattr(Cfg, "scale", original))


# -- float keys: -0.0 and 0.0 are equal in Python, not in what code computes from them ----------

def test_negative_zero_in_a_frozenset_argument():
    class F(Function):
        @staticmethod
        def forward(ctx, t, s):
            return t * (1.0 if math.copysign(1, min(s)) > 0 else 2.0)

        @staticmethod
        def backward(ctx, g):
            return g, None

    sets = [frozenset([0.0]), frozenset([-0.0]), frozenset([-0.0]), frozenset([0.0])]
    _matches_eager(F, lambda i: (_x(i), sets[i]), refusable=False)


def test_negative_zero_as_a_dict_key_with_the_same_value():
    class F(Function):
        @staticmethod
        def forward(ctx, t, table):
            (k,) = table
            return t * math.copysign(3.0, k)

        @staticmethod
        def backward(ctx, g):
            return g, None

    tables = [{0.0: 1}, {-0.0: 1}, {(0.0,): 1}, {(-0.0,): 1}]
    tables[2:] = [{0.0: 1}, {-0.0: 1}]
    _matches_eager(F, lambda i: (_x(i), tables[i]), refusable=False)


# -- attributes computed by the user's code run once per call, as in eager ---------------------

def test_a_descriptor_counting_its_reads():
    calls = {"n": 0}

    class Ticker:
        def __get__(self, obj, objtype=None):
            calls["n"] += 1
            return calls["n"]

    class Cfg:
        tick = Ticker()

    cfg = Cfg()

    class F(Function):
        @staticmethod
        def forward(ctx, t, c):
            return t * c.tick

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_x(i), cfg), state=lambda: calls["n"],
                   reset=lambda: calls.update(n=0))


def test_a_property_of_a_global_that_draws_a_number():
    class Noise:
        def __init__(self):
            self.rng = [0]

        @property
        def level(self):
            self.rng[0] += 1
            return 0.5 * self.rng[0]

    noise = Noise()

    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return t + NOISE_HOLDER.noise.level

        @staticmethod
        def backward(ctx, g):
            return g

    NOISE_HOLDER.noise = noise
    _matches_eager(F, lambda i: (_x(i),), state=lambda: noise.rng[0],
                   reset=lambda: noise.rng.__setitem__(0, 0))


NOISE_HOLDER = types.SimpleNamespace(noise=None)


def test_an_object_whose_getattr_counts():
    class Lazy:
        def __init__(self):
            self.seen = 0

        def __getattr__(self, name):
            self.__dict__["seen"] += 1
            return float(self.__dict__["seen"])

    lazy = Lazy()

    class F(Function):
        @staticmethod
        def forward(ctx, t, obj):
            return t * obj.scale

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_x(i), lazy), state=lambda: lazy.seen,
                   reset=lambda: lazy.__dict__.update(seen=0))


# -- iterators passed in: the trace must not spend what eager's call takes ---------------------

class _Next(Function):
    @staticmethod
    def forward(ctx, t, it):
        ctx.k = next(it)
        return t * ctx.k

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k, None


class _Sum(Function):
    @staticmethod
    def forward(ctx, t, items):
        total = 0.0
        for v in items:
            total += v
        return t * total

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_a_shared_counter_passed_in():
    holder: list[Any] = [None]
    _matches_eager(_Next, lambda i: (_x(i), holder[0]),
                   reset=lambda: holder.__setitem__(0, itertools.count(1)))


def test_a_generator_shared_across_calls():
    def doubling():
        k = 1.0
        while True:
            yield k
            k *= 2

    holder: list[Any] = [None]
    _matches_eager(_Next, lambda i: (_x(i), holder[0]), reset=lambda: holder.__setitem__(0, doubling()))


@pytest.mark.parametrize("spelling", ["generator expression", "iter(list)", "zip", "map", "in a dict"])
def test_a_fresh_iterator_per_call(spelling):
    def make(i):
        values = [0.5 * k for k in range(i + 2)]
        it = {"generator expression": lambda: (v for v in values), "iter(list)": lambda: iter(values),
              "zip": lambda: (a for a, _ in zip(values, values)), "map": lambda: map(float, values),
              "in a dict": lambda: iter(values)}[spelling]()
        return (_x(i), it)

    if spelling == "in a dict":
        class Holder(Function):
            @staticmethod
            def forward(ctx, t, d):
                return _Sum.forward(ctx, t, d["it"])

            @staticmethod
            def backward(ctx, g):
                return g, None

        _matches_eager(Holder, lambda i: (make(i)[0], {"it": make(i)[1]}))
    else:
        _matches_eager(_Sum, make)


def test_an_iterator_argument_is_refused_before_it_is_touched():
    it = iter([2.0, 3.0])
    with pytest.raises(MinihopError, match="MH106.*iterator"):
        minihop.apply(_Next, torch.ones(2, requires_grad=True), it)
    assert next(it) == 2.0  # nothing taken


# -- a direct Capture keeps the single-use rule the cache keeps ---------------------------------

def test_a_single_use_capture_called_directly_serves_one_call():
    gain = {"k": 2.0}

    class Gain:
        @property
        def k(self):  # user code minihop does not analyse: single-use
            return gain["k"]

    g = Gain()

    class F(Function):
        @staticmethod
        def forward(ctx, t, obj):
            return t * obj.k

        @staticmethod
        def backward(ctx, grad):
            return grad, None

    x = torch.randn(3, requires_grad=True)
    cap = minihop.capture(F, x, g)
    assert cap.python_state.single_use
    torch.testing.assert_close(cap(x, g), x * 2.0)
    gain["k"] = 5.0
    with pytest.raises(minihop.GuardMismatchError, match="MH301.*single-use"):
        cap(x, g)  # would return x * 2.0: the first call's value
    torch.testing.assert_close(minihop.apply(F, x, g), x * 5.0)


def test_a_capture_that_reads_only_its_arguments_serves_every_call():
    class F(Function):
        @staticmethod
        def forward(ctx, t, k):
            return t * k

        @staticmethod
        def backward(ctx, grad):
            return grad * 2.0, None

    x = torch.randn(3, requires_grad=True)
    cap = minihop.capture(F, x, 2.0)
    assert not cap.python_state.single_use
    for _ in range(3):
        torch.testing.assert_close(cap(x, 2.0), x * 2.0)


# -- nn.Module state: a module kept on ctx, changed before backward ---------------------------

def test_a_module_argument_kept_on_ctx_set_to_eval_before_backward():
    drop = torch.nn.Dropout(0.2)

    class F(Function):
        @staticmethod
        def forward(ctx, t, mod):
            ctx.mod = mod
            return t * 2

        @staticmethod
        def backward(ctx, g):
            return (g * 3 if ctx.mod.training else g), None

    _matches_eager(F, lambda i: (_x(i), drop), mid=lambda i: drop.train(i % 2 == 0),
                   reset=drop.train, refusable=False)


# -- tensors held in Python containers: the position the code reads --------------------------

WEIGHTS: list[torch.Tensor] = []


def test_the_last_tensor_of_a_growing_global_list():
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return t * WEIGHTS[-1]

        @staticmethod
        def backward(ctx, g):
            return g

    def reset():
        WEIGHTS[:] = [torch.ones(4)]

    _matches_eager(F, lambda i: (_x(i),), between=lambda i: WEIGHTS.append(torch.full((4,), i + 2.0)),
                   reset=reset, refusable=False)


# -- settings read through a call: guarded by their answer -------------------------------------

SCALE_VAR: contextvars.ContextVar[float] = contextvars.ContextVar("scale", default=1.0)


def test_a_context_variable_set_between_calls_and_before_backward():
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return t * SCALE_VAR.get()

        @staticmethod
        def backward(ctx, g):
            return g * SCALE_VAR.get()

    _matches_eager(F, lambda i: (_x(i),), between=lambda i: SCALE_VAR.set(i + 1.0),
                   mid=lambda i: SCALE_VAR.set(i + 7.0), reset=lambda: SCALE_VAR.set(1.0), refusable=False)


def test_torch_thread_count_changed_between_calls():
    before = torch.get_num_threads()

    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return t * torch.get_num_threads()

        @staticmethod
        def backward(ctx, g):
            return g

    try:
        _matches_eager(F, lambda i: (_x(i),), between=lambda i: torch.set_num_threads([1, 2, 2, 1][i]),
                       refusable=False)
    finally:
        torch.set_num_threads(before)


def test_the_recursion_limit_changed_between_calls():
    before = sys.getrecursionlimit()

    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return t * (sys.getrecursionlimit() // 1000)

        @staticmethod
        def backward(ctx, g):
            return g

    try:
        _matches_eager(F, lambda i: (_x(i),), between=lambda i: sys.setrecursionlimit([3000, 5000, 5000, 3000][i]),
                       refusable=False)
    finally:
        sys.setrecursionlimit(before)


def test_the_default_generators_initial_seed_read_by_its_method():
    """``torch.default_generator.initial_seed()``: guarded by its answer, like a setting."""
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return t * (torch.default_generator.initial_seed() % 97)

        @staticmethod
        def backward(ctx, g):
            return g

    state = torch.get_rng_state()
    try:
        _matches_eager(F, lambda i: (_x(i),), between=lambda i: torch.manual_seed([5, 11, 11, 5][i]),
                       refusable=False)
    finally:
        torch.set_rng_state(state)


DISPATCH: dict[str, Any] = {}


def test_a_singledispatch_function_registered_for_a_new_type_between_calls():
    def fresh():
        @functools.singledispatch
        def scale_of(value):
            return 1.0

        return scale_of

    class Box:
        k = 3.0

    class F(Function):
        @staticmethod
        def forward(ctx, t, box):
            return t * DISPATCH["scale"](box)

        @staticmethod
        def backward(ctx, g):
            return g, None

    def between(i):
        if i == 2:
            DISPATCH["scale"].register(Box)(lambda v: v.k)

    box = Box()
    _matches_eager(F, lambda i: (_x(i), box), between=between,
                   reset=lambda: DISPATCH.update(scale=fresh()), refusable=False)


# -- iterators the code reaches outside its arguments: refused before the trace takes from them --

COUNTERS: list[Any] = [None]


def test_a_global_counter_read_with_next():
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return t * next(COUNTERS[0])

        @staticmethod
        def backward(ctx, g):
            return g

    _matches_eager(F, lambda i: (_x(i),), reset=lambda: COUNTERS.__setitem__(0, itertools.count(1)))


def test_a_closure_iterator_read_with_next():
    it: list[Any] = [None]

    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return t * next(it[0])

        @staticmethod
        def backward(ctx, g):
            return g

    _matches_eager(F, lambda i: (_x(i),), reset=lambda: it.__setitem__(0, iter([1.0, 2.0, 3.0, 4.0])))


def test_a_capture_of_edited_graphs_shares_its_single_use_capture_s_one_call():
    state = {"k": 2.0}

    class Gain:
        @property
        def k(self):
            return state["k"]

    class F(Function):
        @staticmethod
        def forward(ctx, t, obj):
            return t * obj.k

        @staticmethod
        def backward(ctx, grad):
            return grad, None

    g, x = Gain(), torch.randn(3, requires_grad=True)
    cap = minihop.capture(F, x, g)
    edited = minihop.with_graphs(cap, fwd=cap.fwd)
    torch.testing.assert_close(edited(x, g), x * 2.0)
    for either in (cap, edited):
        with pytest.raises(minihop.GuardMismatchError, match="single-use"):
            either(x, g)
