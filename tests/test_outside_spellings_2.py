"""Functions written the way outside code writes them, round 2: spellings no other test uses.

Each case is a small Function of a class issue 28 names (nn.Module state, callables passed
in, inner Functions, globals holding library functions, rebound tensors, tensor properties,
float keys, randomness, caches, ctx written in backward, exceptions, warnings and logging,
cyclic objects, records as arguments, user-served attributes, context managers, flags read
by backward, grad modes and double backward) in a spelling the suite had not met. Every case
runs several calls through eager ``F.apply``, ``minihop.function(F)``, ``minihop.apply`` and
``minihop.function(F, fallback="eager")``, changing state between calls (``between``) and
between forward and ``.backward()`` (``mid``), and compares per call: the output, the named
Python state after forward and after backward, every ``.grad``, the warnings and log records
the call made, eager's exception (type and message) if any, and where the global random
stream is left. Strict mode may refuse with a coded ``MinihopError`` (the fallback must then
still equal eager); it may never differ.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import itertools
import logging
import math
import operator
import random
import warnings
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.autograd import Function
from torch.random import initial_seed as _initial_seed

import minihop
from minihop.errors import MinihopError

import eager_modes  # tests/ is on the path (pytest prepends a test file's directory)

LOG = eager_modes.LOG
_matches_eager = eager_modes.matches_eager


def _x(i: int) -> torch.Tensor:
    return torch.randn(3 + i % 2, 4).requires_grad_()


def _fixed(i: int) -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, 12).reshape(3, 4).requires_grad_()


# -- nn.Module state beyond parameters and buffers --------------------------------------------

def test_dropout_module_argument_switched_to_eval_between_calls():
    """A Dropout passed in, eval()/train() between calls: library code reads self.training."""
    drop = nn.Dropout(0.5)

    class F(Function):
        @staticmethod
        def forward(ctx, t, d):
            return d(t.detach())

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_fixed(i), drop), between=lambda i: drop.train(i % 2 == 0),
                   reset=lambda: drop.train())


BN = nn.BatchNorm1d(4)


class _GlobalBN(Function):
    @staticmethod
    def forward(ctx, t):
        with torch.no_grad():
            return BN(t) * 1.0

    @staticmethod
    def backward(ctx, g):
        return g


def test_global_batchnorm_toggled_and_its_running_stats():
    """A BatchNorm in a global: train/eval between calls, running stats written by forward."""
    def reset():
        BN.reset_running_stats()
        BN.train()

    _matches_eager(_GlobalBN, lambda i: (_x(i),), between=lambda i: BN.train(i in (0, 3)),
                   state=lambda: [BN.running_mean, BN.running_var, BN.num_batches_tracked],
                   reset=reset)


def test_layernorm_eps_changed_in_a_closure():
    """A LayerNorm held in a closure, its eps (a plain float attribute) changed between calls."""
    ln = nn.LayerNorm(4, elementwise_affine=False)

    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return ln(t.detach()) * 1.0

        @staticmethod
        def backward(ctx, g):
            return g

    def between(i):
        ln.eps = [1e-5, 10.0, 10.0, 0.5][i]

    _matches_eager(F, lambda i: (_fixed(i),), between=between, refusable=True)


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 2.0
        self.act = nn.ReLU()
        self.table = {"bias": 0.0}

    def forward(self, t):
        return self.act(t) * self.scale + self.table["bias"]


def test_user_module_plain_attribute_changed():
    """A user module's plain float attribute changed between calls."""
    gate = Gate()

    class F(Function):
        @staticmethod
        def forward(ctx, t, m):
            return m(t.detach())

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_fixed(i), gate), between=lambda i: setattr(gate, "scale", 1.0 + i),
                   refusable=False)


def test_user_module_submodule_replaced():
    """A submodule replaced (ReLU -> Tanh -> Sigmoid) between calls."""
    gate = Gate()

    class F(Function):
        @staticmethod
        def forward(ctx, t, m):
            return m(t.detach())

        @staticmethod
        def backward(ctx, g):
            return g, None

    acts = [nn.ReLU(), nn.Tanh(), nn.Tanh(), nn.Sigmoid()]
    _matches_eager(F, lambda i: (_fixed(i), gate), between=lambda i: setattr(gate, "act", acts[i]))


def test_user_module_dict_attribute_mutated():
    """A dict kept as a module attribute, one key written between calls."""
    gate = Gate()

    class F(Function):
        @staticmethod
        def forward(ctx, t, m):
            return m(t.detach())

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_fixed(i), gate), between=lambda i: gate.table.update(bias=float(i)),
                   reset=lambda: gate.table.update(bias=0.0))


def test_forward_hook_registered_between_calls():
    """A forward hook registered on a module argument after the first call."""
    lin = nn.Linear(4, 4)
    handles: list[Any] = []

    class F(Function):
        @staticmethod
        def forward(ctx, t, m):
            with torch.no_grad():
                return m(t)

        @staticmethod
        def backward(ctx, g):
            return g, None

    def between(i):
        if i == 2:
            handles.append(lin.register_forward_hook(lambda mod, inp, out: out * 3))

    def reset():
        while handles:
            handles.pop().remove()

    _matches_eager(F, lambda i: (_fixed(i), lin), between=between, reset=reset)


def test_buffer_replaced_with_register_buffer():
    """A buffer re-registered with another value (and shape) between calls."""
    m = nn.Module()
    m.register_buffer("s", torch.ones(4))

    class F(Function):
        @staticmethod
        def forward(ctx, t, mod):
            return t * mod.s

        @staticmethod
        def backward(ctx, g):
            return g * 2, None

    vals = [torch.ones(4), torch.full((4,), 3.0), torch.full((1,), 5.0), torch.ones(4)]
    _matches_eager(F, lambda i: (_fixed(i), m), between=lambda i: m.register_buffer("s", vals[i]))


def test_module_on_ctx_training_read_by_backward_flipped_before_backward():
    """A module kept on ctx; backward reads its training flag, flipped before .backward()."""
    m = nn.Identity()

    class F(Function):
        @staticmethod
        def forward(ctx, t, mod):
            ctx.mod = mod
            return t * 2

        @staticmethod
        def backward(ctx, g):
            return g * (2 if ctx.mod.training else 5), None

    _matches_eager(F, lambda i: (_fixed(i), m), mid=lambda i: m.train(i % 2 == 1),
                   reset=lambda: m.train())


def _through(m, t):
    return m(t)


def test_module_called_inside_a_helper_with_weight_edited_in_place():
    """A Linear called through a helper; its weight edited in place under no_grad between calls."""
    lin = nn.Linear(4, 2)
    with torch.no_grad():
        lin.weight.fill_(0.5)
        lin.bias.zero_()

    class F(Function):
        @staticmethod
        def forward(ctx, t, mod):
            with torch.no_grad():
                return _through(mod, t)

        @staticmethod
        def backward(ctx, g):
            return g.sum(-1, keepdim=True).expand(-1, 4), None

    def between(i):
        with torch.no_grad():
            lin.weight.mul_(2.0)

    def reset():
        with torch.no_grad():
            lin.weight.fill_(0.5)

    _matches_eager(F, lambda i: (_fixed(i), lin), between=between, reset=reset)


def test_sequential_grown_between_calls():
    """An nn.Sequential argument with a layer appended between calls."""
    seq = nn.Sequential(nn.ReLU())

    class F(Function):
        @staticmethod
        def forward(ctx, t, s):
            return s(t.detach()) + len(s)

        @staticmethod
        def backward(ctx, g):
            return g, None

    def between(i):
        if i == 2:
            seq.append(nn.Tanh())

    def reset():
        while len(seq) > 1:
            del seq[-1]

    _matches_eager(F, lambda i: (_fixed(i), seq), between=between, reset=reset)


def test_module_in_a_list_argument_set_to_eval():
    """Dropout modules in a list argument, one set to eval between calls."""
    mods = [nn.Dropout(0.3), nn.Dropout(0.6)]

    class F(Function):
        @staticmethod
        def forward(ctx, t, ms):
            for m in ms:
                t = m(t)
            return t.detach()

        @staticmethod
        def backward(ctx, g):
            return g, None

    def reset():
        for m in mods:
            m.train()

    _matches_eager(F, lambda i: (_fixed(i), mods), between=lambda i: mods[1].train(i != 1),
                   reset=reset)


# -- callables and classes passed as arguments --------------------------------------------------

class Scaler:
    def __init__(self) -> None:
        self.k = 2.0

    def scale(self, t):
        return t * self.k

    def __call__(self, t):
        return t + self.k


def test_bound_method_whose_object_changes():
    """A bound method passed in; its object's attribute changes between calls."""
    s = Scaler()

    class F(Function):
        @staticmethod
        def forward(ctx, t, fn):
            return fn(t).detach()

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_fixed(i), s.scale), between=lambda i: setattr(s, "k", 1.0 + i),
                   refusable=False)


def test_callable_instance_attribute_changes():
    """An object with __call__ passed in; the attribute __call__ reads changes."""
    s = Scaler()

    class F(Function):
        @staticmethod
        def forward(ctx, t, fn):
            return fn(t).detach()

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_fixed(i), s), between=lambda i: setattr(s, "k", -float(i)),
                   refusable=False)


def test_partial_with_a_fresh_keyword_each_call():
    """functools.partial(torch.mul, other=k) built fresh per call with another k."""
    class F(Function):
        @staticmethod
        def forward(ctx, t, fn):
            return fn(t.detach())

        @staticmethod
        def backward(ctx, g):
            return g, None

    ks = [2.0, 2.0, 3.0, -0.0]
    _matches_eager(F, lambda i: (_fixed(i), functools.partial(torch.mul, other=ks[i])),
                   refusable=False)


def test_partial_over_a_list_mutated_between_calls():
    """functools.partial holding a list whose contents change between calls."""
    weights = [1.0]

    def weighted(ws, t):
        return t * sum(ws)

    fn = functools.partial(weighted, weights)

    class F(Function):
        @staticmethod
        def forward(ctx, t, f):
            return f(t.detach())

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_fixed(i), fn), between=lambda i: weights.append(0.5),
                   reset=lambda: weights.__init__([1.0]))


def test_lambda_over_a_rebound_local():
    """A lambda passed in, reading a local of the caller that is rebound between calls."""
    box = {"k": 1.0}
    k = 1.0
    fn = lambda t: t * k  # noqa: E731

    class F(Function):
        @staticmethod
        def forward(ctx, t, f):
            return f(t.detach())

        @staticmethod
        def backward(ctx, g):
            return g, None

    def between(i):
        nonlocal k
        k = box["k"] + i

    _matches_eager(F, lambda i: (_fixed(i), fn), between=between, refusable=False)


def test_class_argument_class_attribute_changed():
    """A class passed in; a class attribute (int) changes, and a subclass inherits it."""
    class Base:
        factor = 2

    class Child(Base):
        pass

    class F(Function):
        @staticmethod
        def forward(ctx, t, cls):
            ctx.f = cls.factor
            return t * cls.factor

        @staticmethod
        def backward(ctx, g):
            return g * ctx.f, None

    _matches_eager(F, lambda i: (_fixed(i), Child), between=lambda i: setattr(Base, "factor", 2 + i // 2),
                   reset=lambda: setattr(Base, "factor", 2), refusable=False)


def test_getattr_torch_with_a_name_argument():
    """getattr(torch, name) with the name passed in, changing per call."""
    class F(Function):
        @staticmethod
        def forward(ctx, t, name):
            return getattr(torch, name)(t.detach())

        @staticmethod
        def backward(ctx, g):
            return g, None

    names = ["sin", "sin", "cos", "exp"]
    _matches_eager(F, lambda i: (_fixed(i), names[i]), refusable=False)


class Settings:
    alpha = 1.0
    beta = 2.0


def test_getattr_settings_with_a_variable_name_and_value_changed():
    """getattr(Settings, name): the name changes per call and the value between calls."""
    class F(Function):
        @staticmethod
        def forward(ctx, t, name):
            return t * getattr(Settings, name)

        @staticmethod
        def backward(ctx, g):
            return g * getattr(Settings, "beta"), None

    names = ["alpha", "alpha", "beta", "alpha"]

    def reset():
        Settings.alpha, Settings.beta = 1.0, 2.0

    _matches_eager(F, lambda i: (_fixed(i), names[i]), between=lambda i: setattr(Settings, "alpha", 1.0 + i),
                   mid=lambda i: setattr(Settings, "beta", 2.0 + i), reset=reset, refusable=False)


def test_attrgetter_and_methodcaller_arguments():
    """operator.methodcaller passed in; its method name changes per call."""
    class F(Function):
        @staticmethod
        def forward(ctx, t, call):
            return call(t.detach())

        @staticmethod
        def backward(ctx, g):
            return g, None

    calls = [operator.methodcaller("sin"), operator.methodcaller("cos"),
             operator.methodcaller("clamp", min=0.0), operator.methodcaller("clamp", min=0.5)]
    _matches_eager(F, lambda i: (_fixed(i), calls[i]))


ACTS: dict[str, Any] = {"act": torch.relu}


class _ActsByName(Function):
    @staticmethod
    def forward(ctx, t, name):
        return ACTS[name](t.detach())

    @staticmethod
    def backward(ctx, g, *rest):
        return g, None


def test_global_registry_of_callables_mutated():
    """A global dict registry of activation functions, entry replaced between calls."""
    fns = [torch.relu, torch.tanh, torch.tanh, torch.sigmoid]
    _matches_eager(_ActsByName, lambda i: (_fixed(i), "act"),
                   between=lambda i: ACTS.__setitem__("act", fns[i]),
                   reset=lambda: ACTS.__setitem__("act", torch.relu))


def test_subclass_method_overridden_on_the_instance_class():
    """An instance whose class's method is replaced between calls (monkeypatching a class)."""
    class Op:
        def run(self, t):
            return t * 2

    op = Op()

    class F(Function):
        @staticmethod
        def forward(ctx, t, o):
            return o.run(t.detach())

        @staticmethod
        def backward(ctx, g):
            return g, None

    def between(i):
        if i == 2:
            Op.run = lambda self, t: t * 7

    _matches_eager(F, lambda i: (_fixed(i), op), between=between,
                   reset=lambda: setattr(Op, "run", lambda self, t: t * 2))


# -- a forward that calls another Function's .apply --------------------------------------------

INNER_SCALE = 2.0
INNER_SEEN: list[float] = []


class _InnerScaled(Function):
    @staticmethod
    def forward(ctx, t):
        INNER_SEEN.append(INNER_SCALE)
        return t * INNER_SCALE

    @staticmethod
    def backward(ctx, g):
        return g * INNER_SCALE


class _OuterOfInner(Function):
    @staticmethod
    def forward(ctx, t):
        with torch.no_grad():
            y = _InnerScaled.apply(t)
        return y + 1

    @staticmethod
    def backward(ctx, g):
        return g


def test_inner_function_reading_and_appending_a_global():
    """The inner Function reads a global float and appends to a global list."""
    global INNER_SCALE

    def between(i):
        global INNER_SCALE
        INNER_SCALE = [2.0, 2.0, 3.0, -0.0][i]

    _matches_eager(_OuterOfInner, lambda i: (_fixed(i),), between=between,
                   state=lambda: list(INNER_SEEN), reset=INNER_SEEN.clear)
    INNER_SCALE = 2.0


def test_inner_function_defined_inside_forward():
    """A Function class statement inside forward, its apply used there."""
    cfg = {"k": 2.0}

    class F(Function):
        @staticmethod
        def forward(ctx, t):
            class Inner(Function):
                @staticmethod
                def forward(ictx, u):
                    return u * cfg["k"]

                @staticmethod
                def backward(ictx, g):
                    return g

            with torch.no_grad():
                return Inner.apply(t)

        @staticmethod
        def backward(ctx, g):
            return g

    _matches_eager(F, lambda i: (_fixed(i),), between=lambda i: cfg.update(k=2.0 + i),
                   reset=lambda: cfg.update(k=2.0))


INNER_ALIAS = _InnerScaled.apply


class _ThroughAlias(Function):
    @staticmethod
    def forward(ctx, t):
        with torch.no_grad():
            return INNER_ALIAS(t)

    @staticmethod
    def backward(ctx, g):
        return g


def test_global_alias_of_an_inner_apply_rebound():
    """A global alias `INNER = Inner.apply` rebound to torch.neg between calls."""
    global INNER_ALIAS

    def between(i):
        global INNER_ALIAS
        INNER_ALIAS = _InnerScaled.apply if i < 2 else torch.neg

    _matches_eager(_ThroughAlias, lambda i: (_fixed(i),), between=between,
                   state=lambda: len(INNER_SEEN), reset=INNER_SEEN.clear)
    INNER_ALIAS = _InnerScaled.apply


def test_inner_function_passed_as_an_argument():
    """The inner Function class itself passed in as an argument, two different ones."""
    class Double(Function):
        @staticmethod
        def forward(ctx, u):
            return u * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    class Neg(Function):
        @staticmethod
        def forward(ctx, u):
            return -u

        @staticmethod
        def backward(ctx, g):
            return -g

    class F(Function):
        @staticmethod
        def forward(ctx, t, inner):
            with torch.no_grad():
                return inner.apply(t) + 1

        @staticmethod
        def backward(ctx, g):
            return g, None

    inners = [Double, Double, Neg, Double]
    _matches_eager(F, lambda i: (_fixed(i), inners[i]), refusable=False)


# -- a global that holds a library function ------------------------------------------------------

ACT = torch.relu
NORM = torch.nn.functional.normalize


class _GlobalAct(Function):
    @staticmethod
    def forward(ctx, t):
        return ACT(t.detach())

    @staticmethod
    def backward(ctx, g):
        return g


class _GlobalActInBackward(Function):
    @staticmethod
    def forward(ctx, t):
        ctx.save_for_backward(t)
        return t * 2

    @staticmethod
    def backward(ctx, g):
        (t,) = ctx.saved_tensors
        return g * ACT(t)


def _set_act(fn):
    global ACT
    ACT = fn


def test_global_act_rebound_to_a_functional():
    """ACT = torch.relu -> torch.nn.functional.gelu -> torch.special.expit between calls."""
    fns = [torch.relu, torch.nn.functional.gelu, torch.nn.functional.gelu, torch.special.expit]
    _matches_eager(_GlobalAct, lambda i: (_fixed(i),), between=lambda i: _set_act(fns[i]),
                   reset=lambda: _set_act(torch.relu))


def test_global_act_read_in_backward_rebound_before_backward():
    """A global library function read by backward, rebound between forward and .backward()."""
    fns = [torch.tanh, torch.sigmoid, torch.relu, torch.tanh]
    _matches_eager(_GlobalActInBackward, lambda i: (_fixed(i),), mid=lambda i: _set_act(fns[i]),
                   reset=lambda: _set_act(torch.relu))


class _GlobalNorm(Function):
    @staticmethod
    def forward(ctx, t):
        return NORM(t.detach(), dim=-1)

    @staticmethod
    def backward(ctx, g):
        return g


def test_global_functional_rebound_to_a_partial():
    """NORM = F.normalize rebound to functools.partial(F.normalize, p=1.0)."""
    global NORM

    def between(i):
        global NORM
        NORM = torch.nn.functional.normalize if i < 2 else functools.partial(
            torch.nn.functional.normalize, p=1.0)

    _matches_eager(_GlobalNorm, lambda i: (_fixed(i),), between=between)
    NORM = torch.nn.functional.normalize


# -- tensors rebound ------------------------------------------------------------------------------

class _ClassTensor(Function):
    W = torch.ones(4)

    @staticmethod
    def forward(ctx, t):
        return t * _ClassTensor.W

    @staticmethod
    def backward(ctx, g):
        return g * _ClassTensor.W


def test_function_class_attribute_tensor_replaced_between_and_mid():
    """The Function's own class attribute tensor replaced between calls and before backward."""
    def between(i):
        _ClassTensor.W = torch.full((4,), 1.0 + i)

    def mid(i):
        if i % 2:
            _ClassTensor.W = torch.full((4,), -3.0)

    _matches_eager(_ClassTensor, lambda i: (_fixed(i),), between=between, mid=mid,
                   reset=lambda: setattr(_ClassTensor, "W", torch.ones(4)))


GT = torch.ones(4)


class _GlobalTensorAdd(Function):
    @staticmethod
    def forward(ctx, t):
        return t + GT

    @staticmethod
    def backward(ctx, g):
        return g * GT.sum()


def test_global_tensor_added_in_place_between_calls():
    """A global tensor mutated in place (add_) between calls and before backward."""
    def reset():
        GT.fill_(1.0)

    _matches_eager(_GlobalTensorAdd, lambda i: (_fixed(i),), between=lambda i: GT.add_(1.0),
                   mid=lambda i: GT.mul_(2.0) if i == 2 else None, reset=reset)


def test_tensor_in_a_list_on_ctx_rebound_before_backward():
    """A list argument kept on ctx, its tensor item rebound before backward."""
    class F(Function):
        @staticmethod
        def forward(ctx, t, ws):
            ctx.ws = ws
            return t * ws[0]

        @staticmethod
        def backward(ctx, g):
            return g * ctx.ws[0] + ctx.ws[-1], None

    box: list[Any] = []

    def make(i):
        box[:] = [[torch.full((4,), 2.0)]]
        return (_fixed(i), box[0])

    def mid(i):
        box[0][0] = torch.full((4,), 9.0 + i)

    _matches_eager(F, make, mid=mid)


class Slotted:
    __slots__ = ("t", "k")

    def __init__(self, t, k):
        self.t = t
        self.k = k


def test_slots_object_on_ctx_tensor_rebound_before_backward():
    """A __slots__ object kept on ctx; its tensor and float slots rebound before backward."""
    class F(Function):
        @staticmethod
        def forward(ctx, t, obj):
            ctx.obj = obj
            return t * obj.t * obj.k

        @staticmethod
        def backward(ctx, g):
            return g * ctx.obj.t * ctx.obj.k, None

    objs: list[Any] = []

    def make(i):
        objs[:] = [Slotted(torch.full((4,), 2.0), 1.0)]
        return (_fixed(i), objs[0])

    def mid(i):
        objs[0].t = torch.full((4,), 3.0)
        objs[0].k = -1.0 * i

    _matches_eager(F, make, mid=mid)


@dataclasses.dataclass
class Weights:
    w: torch.Tensor
    extra: list


def test_dataclass_on_ctx_field_rebound_and_list_grown_before_backward():
    """A dataclass kept on ctx; its tensor field rebound and its list field grown mid."""
    class F(Function):
        @staticmethod
        def forward(ctx, t, p):
            ctx.p = p
            return t * p.w

        @staticmethod
        def backward(ctx, g):
            return g * ctx.p.w * len(ctx.p.extra), None

    p = Weights(torch.full((4,), 2.0), [1])

    def mid(i):
        p.w = torch.full((4,), 1.0 + i)
        p.extra.append(i)

    def reset():
        p.w = torch.full((4,), 2.0)
        p.extra[:] = [1]

    _matches_eager(F, lambda i: (_fixed(i), p), mid=mid, reset=reset)


# -- tensor properties read in forward ----------------------------------------------------------

def test_grad_is_none_branch_on_a_reused_leaf():
    """forward branches on `x.grad is None`; the same leaf accumulates .grad across calls."""
    leaf = torch.linspace(-1.0, 1.0, 12).reshape(3, 4).requires_grad_()

    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return t * (1.0 if t.grad is None else 3.0)

        @staticmethod
        def backward(ctx, g):
            return g

    def reset():
        leaf.grad = None

    _matches_eager(F, lambda i: (leaf,), reset=reset, state=lambda: leaf.grad)


def test_grad_value_read_in_forward():
    """forward reads x.grad's values (optimizer-style), the leaf reused across calls."""
    leaf = torch.linspace(-1.0, 1.0, 12).reshape(3, 4).requires_grad_()

    class F(Function):
        @staticmethod
        def forward(ctx, t):
            g = t.grad
            return t * 2 if g is None else t * 2 + g

        @staticmethod
        def backward(ctx, g):
            return g

    _matches_eager(F, lambda i: (leaf,), reset=lambda: setattr(leaf, "grad", None),
                   state=lambda: leaf.grad)


def test_is_leaf_and_grad_fn_branches():
    """forward branches on is_leaf and on grad_fn being None; leaf and non-leaf alternate."""
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            k = (2.0 if t.is_leaf else 5.0) + (0.0 if t.grad_fn is None else 1.0)
            return t * k

        @staticmethod
        def backward(ctx, g):
            return g

    base: list[Any] = []

    def make(i):
        x = _fixed(i)
        base[:] = [x]
        return (x if i % 2 == 0 else x * 1.0,)

    _matches_eager(F, make)


def test_version_counter_read_in_forward():
    """forward reads t._version (bumped by in-place ops before the call)."""
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return t * (1 + t._version)

        @staticmethod
        def backward(ctx, g):
            return g

    def make(i):
        x = torch.zeros(3, 4)
        for _ in range(i):
            x.add_(1.0)
        return (x.requires_grad_(),)

    _matches_eager(F, make)


def test_contiguity_and_stride_branch():
    """forward branches on is_contiguous() and stride(); transposed inputs alternate."""
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            k = 2.0 if t.is_contiguous() else 3.0
            return t * k + t.stride()[0]

        @staticmethod
        def backward(ctx, g):
            return g

    def make(i):
        x = torch.linspace(0.0, 1.0, 16).reshape(4, 4)
        return ((x if i % 2 == 0 else x.t()).requires_grad_(),)

    _matches_eager(F, make)


def test_retains_grad_read_in_forward():
    """forward reads retains_grad of a non-leaf the caller marked or not."""
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return t * (4.0 if t.retains_grad else 1.0)

        @staticmethod
        def backward(ctx, g):
            return g

    def make(i):
        x = _fixed(i) * 1.0
        if i % 2:
            x.retain_grad()
        return (x,)

    _matches_eager(F, make)


# -- float keys -------------------------------------------------------------------------------

def test_negative_zero_scalar_argument_through_copysign():
    """A float argument 0.0 then -0.0: equal in Python, different through copysign/atan2."""
    class F(Function):
        @staticmethod
        def forward(ctx, t, s):
            return t * math.atan2(s, -1.0)

        @staticmethod
        def backward(ctx, g):
            return g, None

    vals = [0.0, -0.0, -0.0, 0.0]
    _matches_eager(F, lambda i: (_fixed(i), vals[i]), refusable=False)


def test_nan_in_a_tuple_argument():
    """A tuple (nan, 1.0) then (1.0, 1.0): forward branches on isnan."""
    class F(Function):
        @staticmethod
        def forward(ctx, t, pair):
            a, b = pair
            return t * (b if math.isnan(a) else a + b)

        @staticmethod
        def backward(ctx, g):
            return g, None

    pairs = [(math.nan, 1.0), (math.nan, 1.0), (1.0, 1.0), (math.nan, 2.0)]
    _matches_eager(F, lambda i: (_fixed(i), pairs[i]), refusable=False)


def test_negative_zero_in_a_dataclass_field():
    """A frozen dataclass with a nested tuple field (0.0,) then (-0.0,)."""
    @dataclasses.dataclass(frozen=True)
    class Opt:
        shift: tuple

    class F(Function):
        @staticmethod
        def forward(ctx, t, o):
            return t + 1.0 / (o.shift[0] or math.copysign(1e-3, o.shift[0]))

        @staticmethod
        def backward(ctx, g):
            return g, None

    opts = [Opt((0.0,)), Opt((-0.0,)), Opt((0.0,)), Opt((-0.0,))]
    _matches_eager(F, lambda i: (_fixed(i), opts[i]))


def test_true_one_and_one_point_zero():
    """True, 1 and 1.0 are equal and hash alike; forward branches on their types."""
    class F(Function):
        @staticmethod
        def forward(ctx, t, flag):
            if flag is True:
                return t * 2
            return t * (3 if isinstance(flag, float) else 4)

        @staticmethod
        def backward(ctx, g):
            return g, None

    flags = [True, 1, 1.0, True]
    _matches_eager(F, lambda i: (_fixed(i), flags[i]), refusable=False)


def test_negative_zero_key_in_a_dict_of_values():
    """A dict {-0.0: 2.0} then {0.0: 2.0}: forward reads the key's sign."""
    class F(Function):
        @staticmethod
        def forward(ctx, t, table):
            return t * sum(math.copysign(v, k) for k, v in table.items())

        @staticmethod
        def backward(ctx, g):
            return g, None

    tables = [{-0.0: 2.0}, {0.0: 2.0}, {0.0: 2.0, 1.0: 1.0}, {-0.0: 2.0, 1.0: 1.0}]
    _matches_eager(F, lambda i: (_fixed(i), tables[i]))


# -- randomness -----------------------------------------------------------------------------------

def test_generator_made_and_seeded_inside_forward_from_an_argument():
    """torch.Generator().manual_seed(seed) in forward, seed passed in; rand with generator=."""
    class F(Function):
        @staticmethod
        def forward(ctx, t, seed):
            g = torch.Generator().manual_seed(seed)
            ctx.seed = seed
            return t + torch.rand(t.shape, generator=g)

        @staticmethod
        def backward(ctx, g):
            gen = torch.Generator()
            gen.manual_seed(ctx.seed + 1)
            return g * torch.rand(g.shape, generator=gen), None

    seeds = [1, 1, 2, 3]
    _matches_eager(F, lambda i: (_fixed(i), seeds[i]))


def test_generator_argument_shared_across_calls():
    """One torch.Generator passed in every call: its state advances as in eager."""
    gen = torch.Generator()

    class F(Function):
        @staticmethod
        def forward(ctx, t, g):
            return t * torch.randn(t.shape, generator=g)

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_fixed(i), gen), reset=lambda: gen.manual_seed(7),
                   state=lambda: gen.get_state())


def test_checkpoint_style_rng_state_replayed_in_backward():
    """forward saves get_rng_state and draws a mask; backward restores it and draws again."""
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            ctx.state = torch.get_rng_state()
            mask = torch.rand(t.shape) > 0.5
            return t * mask

        @staticmethod
        def backward(ctx, g):
            now = torch.get_rng_state()
            torch.set_rng_state(ctx.state)
            mask = torch.rand(g.shape) > 0.5
            torch.set_rng_state(now)
            return g * mask

    _matches_eager(F, lambda i: (_fixed(i),), mid=lambda i: torch.rand(3))


def test_initial_seed_read_in_forward_after_reseeding():
    """forward reads torch.initial_seed(); the caller reseeds between calls."""
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return t + float(torch.initial_seed() % 97)

        @staticmethod
        def backward(ctx, g):
            return g

    def between(i):
        torch.manual_seed([0, 5, 5, 11][i])

    _matches_eager(F, lambda i: (_fixed(i),), between=between)
    cap = minihop.capture(F, _fixed(0))
    assert any("torch.initial_seed" in r for r in cap.python_state.single_use), cap.python_state.single_use


def test_python_random_in_forward():
    """random.random() (Python's stream) scales the output in forward."""
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            ctx.k = random.random()
            return t * ctx.k

        @staticmethod
        def backward(ctx, g):
            return g * ctx.k

    _matches_eager(F, lambda i: (_fixed(i),), state=lambda: random.random())


def test_fork_rng_inside_forward():
    """torch.random.fork_rng around a reseed inside forward leaves the outer stream alone."""
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            with torch.random.fork_rng():
                torch.manual_seed(123)
                noise = torch.rand(t.shape)
            return t + noise + torch.rand(t.shape)

        @staticmethod
        def backward(ctx, g):
            return g

    _matches_eager(F, lambda i: (_fixed(i),))


def test_bernoulli_in_backward():
    """backward draws a bernoulli mask (stochastic gradient), the stream moves in backward."""
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return t * 2

        @staticmethod
        def backward(ctx, g):
            return g * torch.bernoulli(torch.full_like(g, 0.5))

    _matches_eager(F, lambda i: (_fixed(i),), mid=lambda i: torch.rand(i + 1))


def test_random_stream_read_as_a_python_number():
    """torch.rand(()).item() decides a Python branch in forward."""
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return t * 2 if torch.rand(()).item() > 0.5 else t * 3

        @staticmethod
        def backward(ctx, g):
            return g

    _matches_eager(F, lambda i: (_fixed(i),), steps=5)


# -- caches ---------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _causal_mask(n: int) -> torch.Tensor:
    return torch.ones(n, n).tril()


class _Masked(Function):
    @staticmethod
    def forward(ctx, t):
        m = _causal_mask(t.shape[-1])
        ctx.n = t.shape[-1]
        return t @ m

    @staticmethod
    def backward(ctx, g):
        return g @ _causal_mask(ctx.n).t()


def test_lru_cache_mask_helper_then_eager_user_of_the_cache():
    """An lru_cache'd mask helper; the caller reads the cached tensor after minihop calls."""
    def make(i):
        n = [4, 4, 5, 4][i]
        return (torch.linspace(-1.0, 1.0, 3 * n).reshape(3, n).requires_grad_(),)

    _matches_eager(_Masked, make, state=lambda: _causal_mask(4) * 1.0, reset=_causal_mask.cache_clear)


@functools.cache
def _coef(p: float) -> float:
    return 1.0 / (1.0 + p)


def test_functools_cache_on_a_float_argument_with_negative_zero():
    """functools.cache keyed on a float: 0.0 and -0.0 share an entry (as eager)."""
    class F(Function):
        @staticmethod
        def forward(ctx, t, p):
            return t * math.copysign(_coef(p), p)

        @staticmethod
        def backward(ctx, g):
            return g, None

    ps = [0.0, -0.0, 1.0, -0.0]
    _matches_eager(F, lambda i: (_fixed(i), ps[i]), reset=_coef.cache_clear,
                   state=lambda: _coef.cache_info().currsize)


class _ClassMemo(Function):
    _memo: dict = {}

    @staticmethod
    def forward(ctx, t, key):
        if key not in _ClassMemo._memo:
            _ClassMemo._memo[key] = float(len(_ClassMemo._memo) + 1)
        ctx.key = key
        return t * _ClassMemo._memo[key]

    @staticmethod
    def backward(ctx, g):
        return g * _ClassMemo._memo.get(ctx.key, -1.0), None


def test_memo_on_the_function_class_counting_entries():
    """A memo dict on the Function class whose values depend on how many entries exist."""
    keys = ["a", "b", "a", "c"]
    _matches_eager(_ClassMemo, lambda i: (_fixed(i), keys[i]), state=lambda: dict(_ClassMemo._memo),
                   reset=_ClassMemo._memo.clear, mid=lambda i: _ClassMemo._memo.pop("a", None) if i == 2 else None)


# -- ctx written in backward ----------------------------------------------------------------------


def test_list_argument_on_ctx_grown_before_backward():
    """A Python list argument kept on ctx; the caller appends before backward reads len()."""
    hist: list[float] = []

    class F(Function):
        @staticmethod
        def forward(ctx, t, h):
            ctx.h = h
            h.append(1.0)
            return t * len(h)

        @staticmethod
        def backward(ctx, g):
            ctx.h.append(-1.0)
            return g * sum(ctx.h), None

    _matches_eager(F, lambda i: (_fixed(i), hist), mid=lambda i: hist.append(float(i)),
                   state=lambda: list(hist), reset=hist.clear)


def test_backward_writes_an_object_kept_on_ctx():
    """backward increments a counter on an argument object kept on ctx."""
    class Stats:
        def __init__(self):
            self.backs = 0

    stats = Stats()

    class F(Function):
        @staticmethod
        def forward(ctx, t, s):
            ctx.s = s
            return t * (1 + s.backs)

        @staticmethod
        def backward(ctx, g):
            ctx.s.backs += 1
            return g * ctx.s.backs, None

    _matches_eager(F, lambda i: (_fixed(i), stats), state=lambda: stats.backs,
                   reset=lambda: setattr(stats, "backs", 0))


def test_ctx_dict_built_in_forward_mutated_in_backward():
    """forward keeps a dict on ctx; backward pops from it (second use sees it changed)."""
    class F(Function):
        @staticmethod
        def forward(ctx, t, k):
            ctx.cfg = {"k": k, "seen": []}
            return t * k

        @staticmethod
        def backward(ctx, g):
            ctx.cfg["seen"].append(1)
            return g * ctx.cfg.pop("k") * len(ctx.cfg["seen"]), None

    ks = [2.0, 3.0, 3.0, -1.0]
    _matches_eager(F, lambda i: (_fixed(i), ks[i]))


# -- exceptions after writes -------------------------------------------------------------------

EXC_LOG: list[Any] = []


class _WritesThenRaises(Function):
    @staticmethod
    def forward(ctx, t, limit):
        EXC_LOG.append(limit)
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        return t * limit

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_forward_appends_then_raises_its_own_error():
    """forward appends to a global then raises ValueError naming the value, on some calls."""
    limits = [1.0, -1.0, 2.0, -2.0]
    _matches_eager(_WritesThenRaises, lambda i: (_fixed(i), limits[i]), state=lambda: list(EXC_LOG),
                   reset=EXC_LOG.clear)


class ShapeMismatch(RuntimeError):
    def __init__(self, got, want):
        super().__init__(f"got {got}, want {want}")
        self.got = got


class _BackwardWritesThenRaises(Function):
    @staticmethod
    def forward(ctx, t, want):
        ctx.want = want
        return t * 2

    @staticmethod
    def backward(ctx, g):
        EXC_LOG.append(("bwd", ctx.want))
        if g.shape[0] != ctx.want:
            raise ShapeMismatch(g.shape[0], ctx.want)
        return g, None


def test_backward_writes_then_raises_a_custom_error():
    """backward appends then raises a custom RuntimeError subclass with a message."""
    wants = [3, 4, 3, 5]
    _matches_eager(_BackwardWritesThenRaises, lambda i: (_x(i), wants[i]), state=lambda: list(EXC_LOG),
                   reset=EXC_LOG.clear)


def test_forward_sets_an_attribute_then_keyerror():
    """forward sets an object attribute, then a dict lookup with a missing key raises KeyError."""
    class Obj:
        last = None

    obj = Obj()

    class F(Function):
        @staticmethod
        def forward(ctx, t, o, table, key):
            o.last = key
            return t * table[key]

        @staticmethod
        def backward(ctx, g):
            return g, None, None, None

    keys = ["a", "b", "a", "c"]
    _matches_eager(F, lambda i: (_fixed(i), obj, {"a": 2.0, "c": 1.0}, keys[i]),
                   state=lambda: obj.last, reset=lambda: setattr(obj, "last", None))


# -- warnings and logging --------------------------------------------------------------------

def test_warning_with_this_calls_value_in_forward():
    """warnings.warn(f"... {value}") in forward: once per call, with that call's value."""
    class F(Function):
        @staticmethod
        def forward(ctx, t, tau):
            if tau < 1.0:
                warnings.warn(f"temperature {tau} is small", UserWarning)
            return t / tau

        @staticmethod
        def backward(ctx, g):
            return g, None

    taus = [0.5, 0.5, 2.0, 0.25]
    _matches_eager(F, lambda i: (_fixed(i), taus[i]))


def test_warning_in_backward_depending_on_a_tensor_sum():
    """backward warns when a Python number computed from the call's shape is large."""
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            ctx.n = t.numel()
            return t * 2

        @staticmethod
        def backward(ctx, g):
            warnings.warn(f"backward over {ctx.n} elements", RuntimeWarning, stacklevel=2)
            return g * 2

    _matches_eager(F, lambda i: (_x(i),))


def test_logging_info_in_forward_and_backward():
    """A module logger's info() in forward and backward, with %-style arguments."""
    class F(Function):
        @staticmethod
        def forward(ctx, t, name):
            LOG.info("forward %s shape=%s", name, tuple(t.shape))
            return t * 2

        @staticmethod
        def backward(ctx, g):
            LOG.info("backward %d", g.shape[0])
            return g * 2, None

    names = ["a", "a", "b", "a"]
    _matches_eager(F, lambda i: (_x(i), names[i]))


def test_deprecation_warning_once_flag_on_the_class():
    """A 'warn once' flag kept on the Function class (a pattern of real libraries)."""
    class F(Function):
        warned = False

        @staticmethod
        def forward(ctx, t):
            if not F.warned:
                warnings.warn("F is deprecated", DeprecationWarning)
                F.warned = True
            return t * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    _matches_eager(F, lambda i: (_fixed(i),), reset=lambda: setattr(F, "warned", False),
                   state=lambda: F.warned)


def test_print_to_a_global_buffer():
    """print(..., file=BUF) in forward with this call's value."""
    import io
    buf = io.StringIO()

    class F(Function):
        @staticmethod
        def forward(ctx, t, k):
            print("k =", k, file=buf)
            return t * k

        @staticmethod
        def backward(ctx, g):
            return g, None

    def reset():
        buf.seek(0)
        buf.truncate()

    ks = [1.0, 1.0, 2.0, 3.0]
    _matches_eager(F, lambda i: (_fixed(i), ks[i]), state=buf.getvalue, reset=reset)


# -- cyclic objects --------------------------------------------------------------------------

class Node:
    def __init__(self, w, parent=None):
        self.w = w
        self.parent = parent
        self.children: list = []
        if parent is not None:
            parent.children.append(self)


def test_tree_with_parent_links_weight_changed():
    """A tree with parent links (a cycle) passed in; a child's float changes between calls."""
    root = Node(1.0)
    leaf = Node(2.0, root)

    class F(Function):
        @staticmethod
        def forward(ctx, t, node):
            total = node.w + sum(c.w for c in node.children) + node.children[0].parent.w
            return t * total

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_fixed(i), root), between=lambda i: setattr(leaf, "w", 2.0 + i))


def test_list_containing_itself_kept_on_ctx():
    """A list that contains itself, kept on ctx; backward reads its tensor item."""
    class F(Function):
        @staticmethod
        def forward(ctx, t, lst):
            ctx.lst = lst
            return t * lst[0]

        @staticmethod
        def backward(ctx, g):
            return g * ctx.lst[1][0], None

    def make(i):
        lst: list[Any] = [torch.full((4,), 2.0 + i)]
        lst.append(lst)
        return (_fixed(i), lst)

    _matches_eager(F, make)


def test_dict_referring_to_itself_with_a_flag():
    """A config dict with a 'self' entry; the flag is read through the cycle."""
    cfg: dict[str, Any] = {"on": True}
    cfg["self"] = cfg

    class F(Function):
        @staticmethod
        def forward(ctx, t, c):
            return t * (2.0 if c["self"]["self"]["on"] else 3.0)

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_fixed(i), cfg), between=lambda i: cfg.update(on=i % 2 == 0),
                   reset=lambda: cfg.update(on=True))


# -- dataclasses, NamedTuples, enums as arguments ----------------------------------------------

class Mode(enum.Enum):
    SUM = "sum"
    MEAN = "mean"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


def test_enum_argument_chooses_the_reduction():
    """An Enum member passed in picks the reduction."""
    class F(Function):
        @staticmethod
        def forward(ctx, t, mode):
            ctx.mode = mode
            return t.sum(0) if mode is Mode.SUM else t.mean(0)

        @staticmethod
        def backward(ctx, g):
            n = 3
            return (g.expand(n, -1) if ctx.mode is Mode.SUM else g.expand(n, -1) / n), None

    modes = [Mode.SUM, Mode.MEAN, Mode.MEAN, Mode.SUM]
    _matches_eager(F, lambda i: (_fixed(i), modes[i]), refusable=False)


def test_intenum_and_its_int_value():
    """IntEnum HIGH and the int 2 are equal and hash alike; forward branches on the type."""
    class F(Function):
        @staticmethod
        def forward(ctx, t, lvl):
            return t * (10 if isinstance(lvl, Level) else 1) * lvl

        @staticmethod
        def backward(ctx, g):
            return g, None

    lvls = [Level.HIGH, 2, Level.HIGH, 2]
    _matches_eager(F, lambda i: (_fixed(i), lvls[i]), refusable=False)


class Opts(NamedTuple):
    scale: float
    shift: float = 0.0


def test_namedtuple_argument_replaced_per_call():
    """A NamedTuple of floats, _replace()d per call, unpacked by field name and position."""
    class F(Function):
        @staticmethod
        def forward(ctx, t, o):
            ctx.o = o
            return t * o.scale + o[1]

        @staticmethod
        def backward(ctx, g):
            return g * ctx.o.scale, None

    base = Opts(2.0)
    opts = [base, base._replace(shift=1.0), base._replace(scale=-0.0), base]
    _matches_eager(F, lambda i: (_fixed(i), opts[i]), refusable=False)


def test_plain_dataclass_field_set_between_calls():
    """A mutable dataclass instance reused; its float field set between calls."""
    @dataclasses.dataclass
    class Cfg:
        alpha: float = 1.0
        name: str = "a"

    cfg = Cfg()

    class F(Function):
        @staticmethod
        def forward(ctx, t, c):
            return t * c.alpha if c.name == "a" else t - c.alpha

        @staticmethod
        def backward(ctx, g):
            return g, None

    def between(i):
        cfg.alpha = 1.0 + i
        cfg.name = "a" if i < 3 else "b"

    _matches_eager(F, lambda i: (_fixed(i), cfg), between=between, refusable=False)


def test_dataclass_with_a_tensor_field_and_post_init():
    """A dataclass whose __post_init__ derives a float from a tensor field."""
    @dataclasses.dataclass
    class P:
        w: torch.Tensor
        norm: float = 0.0

        def __post_init__(self):
            self.norm = float(self.w.abs().sum())

    class F(Function):
        @staticmethod
        def forward(ctx, t, p):
            return t * p.w / p.norm

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_fixed(i), P(torch.full((4,), 1.0 + i))))


# -- attributes served by user code: __slots__, properties, __getattr__, descriptors -------------

def test_slots_object_value_changed_between_calls():
    """A __slots__ object (no __dict__) whose float slot changes between calls."""
    obj = Slotted(None, 1.0)

    class F(Function):
        @staticmethod
        def forward(ctx, t, o):
            return t * o.k

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_fixed(i), obj), between=lambda i: setattr(obj, "k", 1.0 + i),
                   refusable=False)


COUNTER = {"n": 0}


class Schedule:
    @property
    def temperature(self):
        return 1.0 + COUNTER["n"]


def test_property_reading_a_global_counter():
    """A property computed from a global dict the caller bumps between calls."""
    sched = Schedule()

    class F(Function):
        @staticmethod
        def forward(ctx, t, s):
            return t / s.temperature

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_fixed(i), sched), between=lambda i: COUNTER.update(n=i),
                   reset=lambda: COUNTER.update(n=0))


def test_getattr_forwarding_to_a_mutable_dict():
    """__getattr__ forwarding to an inner dict mutated between calls (a config object)."""
    class Config:
        def __init__(self):
            self._d = {"gain": 1.0}

        def __getattr__(self, name):
            try:
                return self.__dict__["_d"][name]
            except KeyError:
                raise AttributeError(name) from None

    cfg = Config()

    class F(Function):
        @staticmethod
        def forward(ctx, t, c):
            return t * c.gain

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_fixed(i), cfg), between=lambda i: cfg._d.update(gain=1.0 + i),
                   refusable=False)


def test_getattribute_override_counting():
    """__getattribute__ overridden to count every attribute read."""
    class Spy:
        def __init__(self):
            object.__setattr__(self, "reads", 0)
            object.__setattr__(self, "k", 2.0)

        def __getattribute__(self, name):
            if name == "k":
                object.__setattr__(self, "reads", object.__getattribute__(self, "reads") + 1)
            return object.__getattribute__(self, name)

    spy = Spy()

    class F(Function):
        @staticmethod
        def forward(ctx, t, s):
            return t * s.k

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_fixed(i), spy), state=lambda: object.__getattribute__(spy, "reads"),
                   reset=lambda: object.__setattr__(spy, "reads", 0))


EXTERNAL = {"scale": 1.0}


class FromTable:
    def __get__(self, obj, objtype=None):
        return EXTERNAL["scale"]


def test_data_descriptor_reading_an_external_table():
    """A class-level descriptor whose __get__ reads a global table the caller edits."""
    class Holder:
        scale = FromTable()

    h = Holder()

    class F(Function):
        @staticmethod
        def forward(ctx, t, o):
            return t * o.scale

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_fixed(i), h), between=lambda i: EXTERNAL.update(scale=1.0 + i),
                   reset=lambda: EXTERNAL.update(scale=1.0))


def test_cached_property_computed_once_per_object():
    """functools.cached_property on a fresh object per call, with a global counter."""
    made = {"n": 0}

    class Lazy:
        @functools.cached_property
        def table(self):
            made["n"] += 1
            return float(made["n"])

    class F(Function):
        @staticmethod
        def forward(ctx, t, o):
            return t * o.table + o.table

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_fixed(i), Lazy()), state=lambda: made["n"],
                   reset=lambda: made.update(n=0))


# -- context managers, generators, iterators -------------------------------------------------

PRECISION = {"fast": False}


@contextlib.contextmanager
def fast_mode():
    old = PRECISION["fast"]
    PRECISION["fast"] = True
    try:
        yield
    finally:
        PRECISION["fast"] = old


def _act(t):
    return t.relu() if PRECISION["fast"] else t.tanh()


class _InFastMode(Function):
    @staticmethod
    def forward(ctx, t):
        with fast_mode():
            a = _act(t)
        return a + _act(t)

    @staticmethod
    def backward(ctx, g):
        return g


def test_contextmanager_flipping_a_global_flag_inside_forward():
    """A @contextmanager flips a global flag inside forward; the caller flips it between calls."""
    _matches_eager(_InFastMode, lambda i: (_fixed(i),), between=lambda i: PRECISION.update(fast=i == 2),
                   state=lambda: PRECISION["fast"], reset=lambda: PRECISION.update(fast=False))


def test_exitstack_and_a_generator_argument():
    """A generator argument drained in forward inside an ExitStack with a callback."""
    closed: list[int] = []

    class F(Function):
        @staticmethod
        def forward(ctx, t, gen):
            with contextlib.ExitStack() as stack:
                stack.callback(closed.append, 1)
                total = sum(gen)
            return t * total

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_fixed(i), (v * 0.5 for v in range(i + 1))),
                   state=lambda: len(closed), reset=closed.clear)


TICKS = itertools.count()


class _Ticks(Function):
    @staticmethod
    def forward(ctx, t):
        ctx.k = next(TICKS)
        return t * ctx.k

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k


def test_global_itertools_count_read_with_next_in_forward():
    """A global itertools.count advanced by forward every call."""
    def reset():
        global TICKS
        TICKS = itertools.count(1)

    _matches_eager(_Ticks, lambda i: (_fixed(i),), reset=reset)


def test_zip_iterator_argument():
    """A zip iterator pairing floats, passed in and consumed in forward."""
    class F(Function):
        @staticmethod
        def forward(ctx, t, pairs):
            return t * sum(a * b for a, b in pairs)

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_fixed(i), zip([1.0, 2.0], [float(i), 1.0])))


# -- globals and flags changed between forward and backward ---------------------------------------

FLAGS = {"clip": False}
GRAD_SCALE = 1.0


class _FlagInBackward(Function):
    @staticmethod
    def forward(ctx, t):
        return t * 2

    @staticmethod
    def backward(ctx, g):
        g = g * GRAD_SCALE
        return g.clamp(-1.0, 1.0) if FLAGS["clip"] else g


def test_global_dict_flag_and_float_changed_before_backward():
    """backward reads a global dict flag and a global float, both changed before .backward()."""
    def mid(i):
        global GRAD_SCALE
        FLAGS["clip"] = i % 2 == 1
        GRAD_SCALE = 1.0 + i

    def reset():
        global GRAD_SCALE
        FLAGS["clip"] = False
        GRAD_SCALE = 1.0

    _matches_eager(_FlagInBackward, lambda i: (_fixed(i),), mid=mid, reset=reset)


def test_environment_variable_read_in_backward_set_before_backward():
    """backward reads os.environ, which the caller sets between forward and backward."""
    import os

    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return t * 2

        @staticmethod
        def backward(ctx, g):
            return g * (3.0 if os.environ.get("MINIHOP_RT2_FLAG") == "1" else 1.0)

    def mid(i):
        os.environ["MINIHOP_RT2_FLAG"] = "1" if i % 2 else "0"

    _matches_eager(F, lambda i: (_fixed(i),), mid=mid,
                   reset=lambda: os.environ.pop("MINIHOP_RT2_FLAG", None))


def test_factory_closure_flag_flipped_before_backward():
    """A Function made by a factory; backward reads a nonlocal the factory's setter flips."""
    def make_fn():
        sharp = False

        class F(Function):
            @staticmethod
            def forward(ctx, t):
                return t.sigmoid().detach()

            @staticmethod
            def backward(ctx, g):
                return g * (4.0 if sharp else 1.0)

        def set_sharp(v):
            nonlocal sharp
            sharp = v

        return F, set_sharp

    F, set_sharp = make_fn()
    _matches_eager(F, lambda i: (_fixed(i),), mid=lambda i: set_sharp(i % 2 == 1),
                   reset=lambda: set_sharp(False))


def test_instance_attribute_of_a_global_object_changed_before_backward():
    """backward reads an attribute of an object held by a global, changed before backward."""
    class Trainer:
        step = 0

    TRAINER.obj = Trainer()

    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return t * 2

        @staticmethod
        def backward(ctx, g):
            return g * (1.0 + TRAINER.obj.step)

    _matches_eager(F, lambda i: (_fixed(i),), mid=lambda i: setattr(TRAINER.obj, "step", i),
                   reset=lambda: setattr(TRAINER.obj, "step", 0))


class _Box:
    obj: Any = None


TRAINER = _Box()


# -- grad modes inside, double backward ------------------------------------------------------

def test_enable_grad_and_autograd_grad_inside_forward():
    """forward computes an inner gradient with enable_grad + torch.autograd.grad."""
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            with torch.enable_grad():
                u = t.detach().requires_grad_()
                (du,) = torch.autograd.grad((u ** 3).sum(), u)
            ctx.save_for_backward(du)
            return du

        @staticmethod
        def backward(ctx, g):
            (du,) = ctx.saved_tensors
            return g * du

    _matches_eager(F, lambda i: (_fixed(i),))


def test_no_grad_inside_backward_and_a_grad_mode_branch():
    """backward under an inner no_grad; forward branches on torch.is_grad_enabled()."""
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            ctx.k = 2.0 if torch.is_grad_enabled() else 3.0
            return t * ctx.k

        @staticmethod
        def backward(ctx, g):
            with torch.no_grad():
                s = g * ctx.k
            return s

    _matches_eager(F, lambda i: (_fixed(i),))


def test_caller_no_grad_then_grad_calls():
    """The caller alternates torch.no_grad() and grad mode around the call."""
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            ctx.save_for_backward(t)
            return t.sin()

        @staticmethod
        def backward(ctx, g):
            (t,) = ctx.saved_tensors
            return g * t.cos()

    def script(call):
        out = []
        for i in range(4):
            x = _fixed(i)
            if i % 2:
                with torch.no_grad():
                    y = call(x)
                out.append((y.clone(), y.requires_grad))
            else:
                y = call(x)
                y.sum().backward()
                out.append((y.detach().clone(), x.grad.clone()))
        return out

    expected = script(F.apply)
    for call in (minihop.function(F), lambda a: minihop.apply(F, a), minihop.function(F, fallback="eager")):
        minihop.reset()
        got = script(call)
        for e, m in zip(expected, got, strict=True):
            assert type(e[1]) is type(m[1])
            torch.testing.assert_close(m[0], e[0], rtol=0, atol=0)
            if isinstance(e[1], torch.Tensor):
                torch.testing.assert_close(m[1], e[1], rtol=0, atol=0)
            else:
                assert e[1] == m[1]


DB_SCALE = 2.0


class _TwiceDifferentiable(Function):
    @staticmethod
    def forward(ctx, t):
        ctx.save_for_backward(t)
        return t ** 3 * DB_SCALE

    @staticmethod
    def backward(ctx, g):
        (t,) = ctx.saved_tensors
        return g * 3 * t ** 2 * DB_SCALE


def test_double_backward_with_a_global_scale_changed_between_calls():
    """create_graph=True then grad of grad; a global read by both passes changes between calls."""
    global DB_SCALE

    def script(call):
        global DB_SCALE
        out = []
        for i in range(3):
            DB_SCALE = [2.0, 2.0, 5.0][i]
            x = _fixed(i)
            y = call(x)
            (gx,) = torch.autograd.grad(y.sum(), x, create_graph=True)
            (ggx,) = torch.autograd.grad(gx.sum(), x)
            out.append((y.detach().clone(), gx.detach().clone(), ggx.clone()))
        return out

    expected = script(_TwiceDifferentiable.apply)
    for call in (minihop.function(_TwiceDifferentiable), lambda a: minihop.apply(_TwiceDifferentiable, a),
                 minihop.function(_TwiceDifferentiable, fallback="eager")):
        minihop.reset()
        try:
            got = script(call)
        except MinihopError:
            continue
        for e, m in zip(expected, got, strict=True):
            for a, b in zip(e, m, strict=True):
                torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)
    DB_SCALE = 2.0


# -- inference mode around the call ---------------------------------------------------------

def test_inference_mode_around_the_call():
    """forward branches on torch.is_inference_mode_enabled(); one call under inference_mode."""
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return t * (2.0 if torch.is_inference_mode_enabled() else 3.0)

        @staticmethod
        def backward(ctx, g):
            return g

    def script(call):
        out = []
        for i in range(3):
            x = _fixed(i)
            if i == 1:
                with torch.inference_mode():
                    out.append(call(x.detach()).clone())
            else:
                out.append(call(x).detach().clone())
        return out

    expected = script(F.apply)
    modes = {"strict": minihop.function(F), "apply": lambda a: minihop.apply(F, a),
             "fallback": minihop.function(F, fallback="eager")}
    for mode, call in modes.items():
        minihop.reset()
        try:
            got = script(call)
        except MinihopError as e:
            assert mode != "fallback" and "inference mode" in str(e), (mode, e)
            continue
        for e, m in zip(expected, got, strict=True):
            torch.testing.assert_close(m, e, rtol=0, atol=0)


# -- process-wide settings read in forward -----------------------------------------------------

def test_default_dtype_read_in_forward():
    """forward makes a tensor with torch.get_default_dtype(); the caller changes the default."""
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return t * torch.tensor(2.5).to(torch.get_default_dtype()).double().float() + \
                (1.0 if torch.get_default_dtype() == torch.float64 else 0.0)

        @staticmethod
        def backward(ctx, g):
            return g

    def between(i):
        torch.set_default_dtype(torch.float64 if i == 2 else torch.float32)

    try:
        _matches_eager(F, lambda i: (_fixed(i),), between=between,
                       reset=lambda: torch.set_default_dtype(torch.float32))
    finally:
        torch.set_default_dtype(torch.float32)


def test_deterministic_algorithms_flag_branch():
    """forward branches on torch.are_deterministic_algorithms_enabled()."""
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return t * (2.0 if torch.are_deterministic_algorithms_enabled() else 3.0)

        @staticmethod
        def backward(ctx, g):
            return g

    def between(i):
        torch.use_deterministic_algorithms(i % 2 == 1)

    try:
        _matches_eager(F, lambda i: (_fixed(i),), between=between,
                       reset=lambda: torch.use_deterministic_algorithms(False))
    finally:
        torch.use_deterministic_algorithms(False)


def test_logger_level_decides_a_branch():
    """forward computes an extra statistic only when the logger is enabled for DEBUG."""
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            if LOG.isEnabledFor(logging.DEBUG):
                return t * 2
            return t * 3

        @staticmethod
        def backward(ctx, g):
            return g

    def between(i):
        LOG.setLevel(logging.DEBUG if i % 2 else logging.INFO)

    try:
        _matches_eager(F, lambda i: (_fixed(i),), between=between, reset=lambda: LOG.setLevel(logging.INFO))
    finally:
        LOG.setLevel(logging.INFO)


def test_initial_seed_imported_by_name():
    """`from torch.random import initial_seed` bound as a global, after reseeding."""
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return t + float(_initial_seed() % 97)

        @staticmethod
        def backward(ctx, g):
            return g

    _matches_eager(F, lambda i: (_fixed(i),), between=lambda i: torch.manual_seed([0, 5, 5, 11][i]))



def test_class_counter_written_in_forward_read_in_backward():
    """F.calls += 1 in forward, read by backward; a second forward runs before the first backward."""
    class F(Function):
        calls = 0

        @staticmethod
        def forward(ctx, t):
            F.calls += 1
            return t * 2

        @staticmethod
        def backward(ctx, g):
            return g * F.calls

    def script(call):
        F.calls = 0
        x1, x2 = _fixed(0), _fixed(1)
        y1 = call(x1)
        y2 = call(x2)
        y1.sum().backward()
        y2.sum().backward()
        return [x1.grad.clone(), x2.grad.clone(), F.calls]

    expected = script(F.apply)
    for call in (minihop.function(F), lambda a: minihop.apply(F, a), minihop.function(F, fallback="eager")):
        minihop.reset()
        got = script(call)
        torch.testing.assert_close(got[0], expected[0])
        torch.testing.assert_close(got[1], expected[1])
        assert got[2] == expected[2]


def test_dropout_functional_with_a_global_module_training_flag():
    """F.dropout(t, p, training=MODEL.training), MODEL a global switched to eval."""
    class F(Function):
        @staticmethod
        def forward(ctx, t):
            return torch.nn.functional.dropout(t.detach(), 0.5, training=MODEL.training)

        @staticmethod
        def backward(ctx, g):
            return g

    _matches_eager(F, lambda i: (_fixed(i),), between=lambda i: MODEL.train(i % 2 == 0),
                   reset=lambda: MODEL.train())


MODEL = nn.Linear(2, 2)


def test_user_exception_with_a_chained_cause():
    """forward raises a custom error `from` a caught KeyError after writing an attribute."""
    class ConfigError(Exception):
        pass

    seen: list[str] = []

    class F(Function):
        @staticmethod
        def forward(ctx, t, cfg):
            seen.append("fwd")
            try:
                k = cfg["k"]
            except KeyError as e:
                raise ConfigError(f"missing k in {sorted(cfg)}") from e
            return t * k

        @staticmethod
        def backward(ctx, g):
            return g, None

    cfgs = [{"k": 2.0}, {"j": 1.0}, {"k": 3.0}, {}]
    _matches_eager(F, lambda i: (_fixed(i), cfgs[i]), state=lambda: list(seen), reset=seen.clear)


def test_warnings_catch_inside_forward_suppresses_a_library_warning():
    """forward wraps a warning-emitting helper in warnings.catch_warnings + simplefilter('ignore')."""
    def noisy(t):
        warnings.warn("noisy helper", UserWarning)
        return t * 2

    class F(Function):
        @staticmethod
        def forward(ctx, t, quiet):
            if quiet:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    return noisy(t.detach())
            return noisy(t.detach())

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_fixed(i), i % 2 == 0))
