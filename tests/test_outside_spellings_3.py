"""Functions written the way outside code writes them, round 3: spellings rounds 1 and 2 did not use.

Each case is a small Function of a class issue 28 names, reached along a path near the ones
round 2 found open: holders behind properties, descriptors, ``__getattr__`` and weak references;
``deque``/``OrderedDict``/``defaultdict``/``Counter``; dataclasses on ctx; ``ContextVar``;
class state read through ``type(self)``, ``super()`` and staticmethod helpers; Functions made
by factories; ``once_differentiable``; ``needs_input_grad`` paths; ``.data`` swaps;
``requires_grad_`` and hooks between calls; default dtype, backends and autocast flags; Python
attributes on tensors; objects equal but different. Every case runs several calls through
eager ``F.apply``, ``minihop.function(F)``, ``minihop.apply`` and
``minihop.function(F, fallback="eager")`` (``eager_modes.matches_eager``), changing state
between calls and between forward and ``.backward()``: equal records, or (strict) a coded
``MinihopError`` while the fallback still equals eager.
"""

from __future__ import annotations

import abc
import collections
import contextlib
import contextvars
import dataclasses
import enum
import functools
import logging
import math
import warnings
import weakref
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.autograd import Function
from torch.autograd.function import once_differentiable

import minihop

import eager_modes  # tests/ is on the path (pytest prepends a test file's directory)

LOG = eager_modes.LOG
_matches_eager = eager_modes.matches_eager


def _fixed(i: int) -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, 12).reshape(3, 4).requires_grad_()


def _x(i: int) -> torch.Tensor:
    return torch.randn(3, 4).requires_grad_()


# -- holders on ctx reached through properties, descriptors, __getattr__, weakrefs --------------

class _Cfg:
    def __init__(self) -> None:
        self._d = {"s": 2.0}

    @property
    def scale(self) -> float:
        return self._d["s"]


class _PropOnCtx(Function):
    @staticmethod
    def forward(ctx, t, cfg):
        ctx.cfg = cfg
        return t * cfg.scale

    @staticmethod
    def backward(ctx, g):
        return g * ctx.cfg.scale, None


def test_property_on_ctx_object_reads_dict_changed_before_backward():
    """backward reads a property whose dict the caller writes before .backward()."""
    cfg = _Cfg()
    _matches_eager(_PropOnCtx, lambda i: (_fixed(i), cfg),
                   mid=lambda i: cfg._d.update(s=3.0 + i), between=lambda i: cfg._d.update(s=2.0 - i),
                   reset=lambda: cfg._d.update(s=2.0))


class _Forward:
    def __init__(self) -> None:
        self.inner = {"alpha": 1.5}

    def __getattr__(self, name):
        try:
            return self.__dict__["inner"][name]
        except KeyError:
            raise AttributeError(name) from None


class _GetattrOnCtx(Function):
    @staticmethod
    def forward(ctx, t, opts):
        ctx.opts = opts
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * ctx.opts.alpha, None


def test_getattr_object_on_ctx_inner_dict_changed_before_backward():
    """backward reads opts.alpha served by __getattr__; the inner dict changes before backward."""
    opts = _Forward()
    _matches_eager(_GetattrOnCtx, lambda i: (_fixed(i), opts),
                   mid=lambda i: opts.inner.update(alpha=0.5 * i),
                   reset=lambda: opts.inner.update(alpha=1.5))


class _Lookup:
    """A descriptor reading the instance's table under a key chosen at class creation."""

    def __set_name__(self, owner, name):
        self.key = name

    def __get__(self, obj, objtype=None):
        return obj.table[self.key]


class _Knobs:
    gain = _Lookup()

    def __init__(self) -> None:
        self.table = {"gain": 1.0}


class _DescriptorOnCtx(Function):
    @staticmethod
    def forward(ctx, t, knobs):
        ctx.knobs = knobs
        return t * knobs.gain

    @staticmethod
    def backward(ctx, g):
        return g * knobs_gain(ctx.knobs), None


def knobs_gain(k):
    return k.gain + 1.0


def test_descriptor_on_ctx_object_table_changed_before_backward():
    """A __set_name__ descriptor reads the instance's table; the table changes mid and between."""
    knobs = _Knobs()
    _matches_eager(_DescriptorOnCtx, lambda i: (_fixed(i), knobs),
                   between=lambda i: knobs.table.update(gain=1.0 + i),
                   mid=lambda i: knobs.table.update(gain=-1.0 - i) if i % 2 else None,
                   reset=lambda: knobs.table.update(gain=1.0))


class _Holder:
    def __init__(self, v: float) -> None:
        self.v = v


WEAK_SCALES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_KEEP = [_Holder(3.0)]


class _WeakGlobal(Function):
    @staticmethod
    def forward(ctx, t):
        h = WEAK_SCALES.get("s")
        return t * (h.v if h is not None else 1.0)

    @staticmethod
    def backward(ctx, g):
        return g


def test_weak_value_dictionary_global_entry_added_between_calls():
    """A WeakValueDictionary global; the entry appears, then its object's attribute changes."""
    def between(i):
        if i == 1:
            WEAK_SCALES["s"] = _KEEP[0]
        if i == 2:
            _KEEP[0].v = 7.0

    def reset():
        WEAK_SCALES.clear()
        _KEEP[0].v = 3.0

    _matches_eager(_WeakGlobal, lambda i: (_fixed(i),), between=between, reset=reset)


# -- collections holders ----------------------------------------------------------------------

class _DequeOnCtx(Function):
    @staticmethod
    def forward(ctx, t, dq):
        ctx.dq = dq
        return t * dq[-1]

    @staticmethod
    def backward(ctx, g):
        return g * ctx.dq[0] * len(ctx.dq), None


def test_deque_on_ctx_appendleft_before_backward():
    """A deque(maxlen=3) kept on ctx; the caller appendlefts before backward reads dq[0]."""
    dq: collections.deque = collections.deque([1.0, 2.0], maxlen=3)

    def reset():
        dq.clear()
        dq.extend([1.0, 2.0])

    _matches_eager(_DequeOnCtx, lambda i: (_fixed(i), dq), mid=lambda i: dq.appendleft(3.0 + i),
                   reset=reset)


class _OrderedFirst(Function):
    @staticmethod
    def forward(ctx, t, od):
        ctx.od = od
        return t * next(iter(od.values()))

    @staticmethod
    def backward(ctx, g):
        return g * next(iter(ctx.od.values())), None


def test_ordered_dict_move_to_end_between_and_before_backward():
    """An OrderedDict's first value; the caller reorders it with move_to_end."""
    od = collections.OrderedDict(a=2.0, b=3.0, c=-1.0)

    def reset():
        od.clear()
        od.update(a=2.0, b=3.0, c=-1.0)

    _matches_eager(_OrderedFirst, lambda i: (_fixed(i), od),
                   between=lambda i: od.move_to_end("a") if i == 2 else None,
                   mid=lambda i: od.move_to_end(next(iter(od))) if i % 2 else None, reset=reset)


COUNTS: collections.defaultdict = collections.defaultdict(float)


class _DefaultCounts(Function):
    @staticmethod
    def forward(ctx, t, key):
        COUNTS[key] += 1.0
        return t * COUNTS[key]

    @staticmethod
    def backward(ctx, g):
        return g * len(COUNTS), None


def test_defaultdict_global_counted_in_forward():
    """forward bumps a defaultdict global (new keys appear); backward reads its length."""
    _matches_eager(_DefaultCounts, lambda i: (_fixed(i), "ab"[i % 2] if i < 3 else "c"),
                   state=lambda: sorted(COUNTS.items()), reset=COUNTS.clear)


class _CounterArg(Function):
    @staticmethod
    def forward(ctx, t, c):
        ctx.c = c
        (word, n), = c.most_common(1)
        return t * n

    @staticmethod
    def backward(ctx, g):
        return g * sum(ctx.c.values()), None


def test_counter_on_ctx_updated_between_and_before_backward():
    """A collections.Counter: most_common in forward, sum of counts in backward."""
    c: collections.Counter = collections.Counter(a=2)

    def reset():
        c.clear()
        c.update(a=2)

    _matches_eager(_CounterArg, lambda i: (_fixed(i), c), between=lambda i: c.update(b=i),
                   mid=lambda i: c.update(a=1), reset=reset)


# -- dataclasses on ctx -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _FrozenCfg:
    scales: list


class _FrozenOnCtx(Function):
    @staticmethod
    def forward(ctx, t, cfg):
        ctx.cfg = cfg
        return t * cfg.scales[0]

    @staticmethod
    def backward(ctx, g):
        return g * sum(ctx.cfg.scales), None


def test_frozen_dataclass_holding_list_mutated_before_backward():
    """A frozen dataclass (hashable, 'immutable') whose list field the caller grows mid."""
    cfg = _FrozenCfg([2.0])
    _matches_eager(_FrozenOnCtx, lambda i: (_fixed(i), cfg), mid=lambda i: cfg.scales.append(0.5),
                   between=lambda i: cfg.scales.__setitem__(0, 2.0 + i),
                   reset=lambda: cfg.scales.__setitem__(slice(None), [2.0]))


@dataclasses.dataclass
class _Opt:
    lr: float = 0.1
    momentum: float = 0.9


class _DataclassFieldMid(Function):
    @staticmethod
    def forward(ctx, t, opt):
        ctx.opt = opt
        return t * opt.lr

    @staticmethod
    def backward(ctx, g):
        return g * (ctx.opt.momentum + ctx.opt.lr), None


def test_mutable_dataclass_replaced_field_before_backward():
    """A dataclass kept on ctx; dataclasses.replace makes a new one, the old one's field set mid."""
    box = [_Opt()]

    def make(i):
        if i == 2:
            box[0] = dataclasses.replace(box[0], lr=0.5)
        return (_fixed(i), box[0])

    _matches_eager(_DataclassFieldMid, make, mid=lambda i: setattr(box[0], "momentum", 0.1 * i),
                   reset=lambda: box.__setitem__(0, _Opt()))


@dataclasses.dataclass(slots=True)
class _Slotted:
    w: float
    tag: str = "x"


class _SlottedDC(Function):
    @staticmethod
    def forward(ctx, t, s):
        return t * s.w if s.tag == "x" else t - s.w

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_slots_dataclass_fields_changed_between_calls():
    """A dataclass(slots=True): its float and str fields set between calls."""
    s = _Slotted(2.0)

    def between(i):
        s.w = 2.0 + (i % 2)
        s.tag = "x" if i < 2 else "y"

    _matches_eager(_SlottedDC, lambda i: (_fixed(i), s), between=between)


# -- contextvars ------------------------------------------------------------------------------

SCALE_VAR: contextvars.ContextVar = contextvars.ContextVar("scale", default=1.0)


class _CtxVarForward(Function):
    @staticmethod
    def forward(ctx, t):
        return t * SCALE_VAR.get()

    @staticmethod
    def backward(ctx, g):
        return g


def test_context_var_read_in_forward_set_between_calls():
    """A ContextVar read in forward; the caller sets it between calls."""
    tokens: list = []

    def between(i):
        tokens.append(SCALE_VAR.set(1.0 + i))

    def reset():
        SCALE_VAR.set(1.0)

    _matches_eager(_CtxVarForward, lambda i: (_fixed(i),), between=between, reset=reset)


class _CtxVarBackward(Function):
    @staticmethod
    def forward(ctx, t):
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * SCALE_VAR.get()


def test_context_var_read_in_backward_set_before_backward():
    """A ContextVar read in backward; the caller sets it between forward and backward."""
    _matches_eager(_CtxVarBackward, lambda i: (_fixed(i),), mid=lambda i: SCALE_VAR.set(3.0 - i),
                   reset=lambda: SCALE_VAR.set(1.0))


class _CtxVarRun(Function):
    @staticmethod
    def forward(ctx, t, c):
        return c.run(lambda: t * SCALE_VAR.get())

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_context_copy_run_inside_forward():
    """forward runs its body in a contextvars.Context the caller copied (another scale each call)."""
    def make(i):
        c = contextvars.copy_context()
        c.run(SCALE_VAR.set, 2.0 + i)
        return (_fixed(i), c)

    _matches_eager(_CtxVarRun, make, reset=lambda: SCALE_VAR.set(1.0))


# -- class state: type(self), super(), staticmethod helpers, factories -----------------------


class _Scaler:
    factor = 2.0

    def __call__(self, t):
        return t * type(self).factor


class _TypeSelfArg(Function):
    @staticmethod
    def forward(ctx, t, s):
        return s(t)

    @staticmethod
    def backward(ctx, g):
        return g * 2.0, None


def test_class_attribute_read_through_type_self_changed():
    """A callable reads type(self).factor; the class attribute changes between calls."""
    s = _Scaler()
    _matches_eager(_TypeSelfArg, lambda i: (_fixed(i), s),
                   between=lambda i: setattr(_Scaler, "factor", 2.0 + i),
                   reset=lambda: setattr(_Scaler, "factor", 2.0))


class _BaseAct(Function):
    SLOPE = 1.0

    @classmethod
    def forward(cls, ctx, t):
        ctx.slope = cls.SLOPE
        return torch.where(t > 0, t, t * cls.SLOPE)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.slope


class _Leaky(_BaseAct):
    SLOPE = 0.1


class _Leakier(_BaseAct):
    SLOPE = 0.3


def test_classmethod_forward_subclass_overrides_class_attribute():
    """A base Function with a classmethod forward reading cls.SLOPE; subclasses override it."""
    for f in (_Leaky, _Leakier, _BaseAct):
        _matches_eager(f, lambda i: (_fixed(i),))


def test_subclass_class_attribute_changed_between_calls():
    """The subclass's class attribute, read as cls.SLOPE by a classmethod forward, changes between calls."""
    _matches_eager(_Leaky, lambda i: (_fixed(i),), between=lambda i: setattr(_Leaky, "SLOPE", 0.1 * (i + 1)),
                   reset=lambda: setattr(_Leaky, "SLOPE", 0.1))


class _ClassmethodArgs(Function):
    @classmethod
    def forward(cls, ctx, t, cfg):
        ctx.k = cfg.v
        return t * cfg.v

    @classmethod
    def backward(cls, ctx, g):
        return g * ctx.k, None


def test_classmethod_forward_reads_argument_object_attribute():
    """A classmethod forward(cls, ctx, t, cfg) reads cfg.v, set between calls."""
    cfg = _Holder(2.0)
    _matches_eager(_ClassmethodArgs, lambda i: (_fixed(i), cfg), between=lambda i: setattr(cfg, "v", 2.0 + i % 2))


class _SuperBase(Function):
    @staticmethod
    def forward(ctx, t):
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


class _SuperChild(_SuperBase):
    OFFSET = 1.0

    @staticmethod
    def forward(ctx, t):
        return super(_SuperChild, _SuperChild).forward(ctx, t) + _SuperChild.OFFSET

    @staticmethod
    def backward(ctx, g):
        return super(_SuperChild, _SuperChild).backward(ctx, g) * _SuperChild.OFFSET


def test_super_call_in_static_forward_and_backward():
    """Child forward/backward call super(Child, Child).forward; Child.OFFSET changes (mid too)."""
    _matches_eager(_SuperChild, lambda i: (_fixed(i),),
                   between=lambda i: setattr(_SuperChild, "OFFSET", 1.0 + i),
                   mid=lambda i: setattr(_SuperChild, "OFFSET", -1.0) if i == 2 else None,
                   reset=lambda: setattr(_SuperChild, "OFFSET", 1.0))


class _HelperOnClass(Function):
    TABLE = {"k": 2.0}

    @staticmethod
    def _k():
        return _HelperOnClass.TABLE["k"]

    @staticmethod
    def forward(ctx, t):
        return t * _HelperOnClass._k()

    @staticmethod
    def backward(ctx, g):
        return g * _HelperOnClass._k()


def test_staticmethod_helper_reads_class_table():
    """A staticmethod helper on the Function reads a class dict written between calls and mid."""
    _matches_eager(_HelperOnClass, lambda i: (_fixed(i),),
                   between=lambda i: _HelperOnClass.TABLE.update(k=2.0 + i),
                   mid=lambda i: _HelperOnClass.TABLE.update(k=-1.0) if i % 2 else None,
                   reset=lambda: _HelperOnClass.TABLE.update(k=2.0))


class _ClassmethodHelper(Function):
    GAIN = 3.0

    @classmethod
    def gain(cls):
        return cls.GAIN

    @staticmethod
    def forward(ctx, t):
        return t * _ClassmethodHelper.gain()

    @staticmethod
    def backward(ctx, g):
        return g * _ClassmethodHelper.gain()


def test_classmethod_helper_replaced_between_calls():
    """A classmethod helper on the Function; the class attribute and then the helper replaced."""
    orig = _ClassmethodHelper.__dict__["gain"]

    def between(i):
        _ClassmethodHelper.GAIN = 3.0 + i
        if i == 3:
            _ClassmethodHelper.gain = classmethod(lambda cls: -cls.GAIN)

    def reset():
        _ClassmethodHelper.gain = orig
        _ClassmethodHelper.GAIN = 3.0

    _matches_eager(_ClassmethodHelper, lambda i: (_fixed(i),), between=between, reset=reset)


def _make_fn(config: dict) -> type:
    class Made(Function):
        @staticmethod
        def forward(ctx, t):
            return t * config["scale"]

        @staticmethod
        def backward(ctx, g):
            return g * config["grad_scale"]

    return Made


def test_factory_functions_closure_config_mutated():
    """Two classes made by one factory over different dicts; one dict mutated between calls/mid."""
    a = {"scale": 2.0, "grad_scale": 1.0}
    b = {"scale": -1.0, "grad_scale": 3.0}
    fa, fb = _make_fn(a), _make_fn(b)
    _matches_eager(fa, lambda i: (_fixed(i),), between=lambda i: a.update(scale=2.0 + i),
                   mid=lambda i: a.update(grad_scale=0.5 * i),
                   reset=lambda: a.update(scale=2.0, grad_scale=1.0))
    _matches_eager(fb, lambda i: (_fixed(i),))


def _make_fn_value(scale: float) -> type:
    class Made(Function):
        @staticmethod
        def forward(ctx, t):
            return t * scale

        @staticmethod
        def backward(ctx, g):
            return g * scale

    return Made


def test_factory_made_fresh_each_call():
    """A Function class made fresh per call (another closure value each time)."""
    fns = [_make_fn_value(1.0 + k) for k in range(4)]

    class F(Function):
        @staticmethod
        def forward(ctx, t, k):
            return fns[k].apply(t)

        @staticmethod
        def backward(ctx, g):
            return g, None

    _matches_eager(F, lambda i: (_fixed(i), i))


# -- once_differentiable, needs_input_grad, requires_grad and .data between calls -------------

GLOBAL_GAIN = [1.0]


class _Once(Function):
    @staticmethod
    def forward(ctx, t):
        ctx.save_for_backward(t)
        return t.exp()

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (t,) = ctx.saved_tensors
        return g * t.exp() * GLOBAL_GAIN[0]


def test_once_differentiable_backward_reads_global_list_changed_mid():
    """@once_differentiable backward reads a global list item the caller sets before backward."""
    _matches_eager(_Once, lambda i: (_fixed(i),), mid=lambda i: GLOBAL_GAIN.__setitem__(0, 1.0 + i),
                   reset=lambda: GLOBAL_GAIN.__setitem__(0, 1.0))


class _NeedsGrad(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        ga = g * b if ctx.needs_input_grad[0] else None
        gb = g * a if ctx.needs_input_grad[1] else None
        return ga, gb


def test_needs_input_grad_second_argument_alternates():
    """The second tensor requires grad on some calls only; backward returns None for it then."""
    def make(i):
        b = torch.linspace(0.5, 2.0, 12).reshape(3, 4)
        return (_fixed(i), b.requires_grad_(i % 2 == 0))

    _matches_eager(_NeedsGrad, make)


class _NeedsGradForward(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.both = all(ctx.needs_input_grad)
        return a * 2.0 + b if ctx.both else a * 3.0 + b

    @staticmethod
    def backward(ctx, g):
        return g * (2.0 if ctx.both else 3.0), g


def test_needs_input_grad_read_in_forward_branches():
    """forward branches on all(ctx.needs_input_grad); the second tensor's requires_grad alternates."""
    _matches_eager(_NeedsGradForward,
                   lambda i: (_fixed(i), torch.ones(3, 4).requires_grad_(i in (1, 2))))


W_PARAM = nn.Parameter(torch.full((4,), 2.0))


class _UsesParam(Function):
    @staticmethod
    def forward(ctx, t, w):
        ctx.save_for_backward(t, w)
        return t * w if w.requires_grad else t * w * 10.0

    @staticmethod
    def backward(ctx, g):
        t, w = ctx.saved_tensors
        return g * w, (g * t).sum(0) if ctx.needs_input_grad[1] else None


def test_parameter_requires_grad_false_between_calls():
    """A parameter frozen with requires_grad_(False) between calls; forward branches on it."""
    def between(i):
        W_PARAM.grad = None
        W_PARAM.requires_grad_(i < 2)

    _matches_eager(_UsesParam, lambda i: (_fixed(i), W_PARAM), between=between,
                   state=lambda: W_PARAM.grad, reset=lambda: W_PARAM.requires_grad_(True))


W_GLOBAL = torch.full((4,), 2.0)


class _GlobalData(Function):
    @staticmethod
    def forward(ctx, t):
        return t * W_GLOBAL

    @staticmethod
    def backward(ctx, g):
        return g * W_GLOBAL


def test_global_tensor_data_swapped_between_calls_and_mid():
    """W.data = another tensor (same shape, then another dtype-preserving value) between and mid."""
    def between(i):
        W_GLOBAL.data = torch.full((4,), 2.0 + i)

    def mid(i):
        if i % 2:
            W_GLOBAL.data = torch.full((4,), -1.0)

    _matches_eager(_GlobalData, lambda i: (_fixed(i),), between=between, mid=mid,
                   reset=lambda: setattr(W_GLOBAL, "data", torch.full((4,), 2.0)))


class _DataOnCtx(Function):
    @staticmethod
    def forward(ctx, t, w):
        ctx.w = w
        return t * w

    @staticmethod
    def backward(ctx, g):
        return g * ctx.w, None


def test_argument_tensor_on_ctx_data_swapped_before_backward():
    """A non-grad tensor kept on ctx as an attribute; the caller swaps its .data before backward."""
    w = torch.full((4,), 2.0)

    def mid(i):
        w.data = torch.full((4,), 3.0 + i)

    _matches_eager(_DataOnCtx, lambda i: (_fixed(i), w), mid=mid,
                   between=lambda i: setattr(w, "data", torch.full((4,), 2.0)))


class _MulParamGrad(Function):
    @staticmethod
    def forward(ctx, t, w):
        ctx.save_for_backward(t, w)
        return t * w

    @staticmethod
    def backward(ctx, g):
        t, w = ctx.saved_tensors
        return g * w, (g * t).sum(0)


def test_tensor_hook_on_parameter_registered_between_calls():
    """A grad hook registered on the weight after the first call (grad clipping style)."""
    w = nn.Parameter(torch.full((4,), 2.0))
    handles: list = []

    def between(i):
        w.grad = None
        if i == 1:
            handles.append(w.register_hook(lambda g: g.clamp(-0.5, 0.5)))

    def reset():
        while handles:
            handles.pop().remove()

    _matches_eager(_MulParamGrad, lambda i: (_fixed(i), w), between=between, state=lambda: w.grad,
                   reset=reset)


class _HookInside(Function):
    @staticmethod
    def forward(ctx, t, w):
        if w.requires_grad:
            w.register_hook(lambda g: g * 0.0)
        return t * w.detach()

    @staticmethod
    def backward(ctx, g):
        return g, g.sum(0)


def test_hook_registered_inside_forward_on_argument():
    """forward registers a grad hook on its weight argument (zeroing it): eager keeps the hook."""
    def make(i):
        return (_fixed(i), torch.full((4,), 2.0, requires_grad=True))

    _matches_eager(_HookInside, make)


# -- dtype, backends, determinism and autocast flags ------------------------------------------

class _DefaultDtypeBackward(Function):
    @staticmethod
    def forward(ctx, t):
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        return (g * torch.tensor(0.1)).to(g.dtype) + torch.tensor(0.1).double().float()


def test_default_dtype_changed_before_backward():
    """backward makes torch.tensor(0.1) in the default dtype the caller changed before backward."""
    def mid(i):
        torch.set_default_dtype(torch.float64 if i % 2 else torch.float32)

    try:
        _matches_eager(_DefaultDtypeBackward, lambda i: (_fixed(i),), mid=mid,
                       between=lambda i: torch.set_default_dtype(torch.float32))
    finally:
        torch.set_default_dtype(torch.float32)


class _DefaultDtypeArange(Function):
    @staticmethod
    def forward(ctx, t):
        r = torch.arange(4.0) / 3.0
        return t * r.to(t.dtype) + (r.dtype == torch.float64)

    @staticmethod
    def backward(ctx, g):
        return g


def test_default_dtype_changed_between_calls_arange():
    """torch.arange(4.0) / 3 in forward: float32 or float64 values rounded back."""
    try:
        _matches_eager(_DefaultDtypeArange, lambda i: (_fixed(i),),
                       between=lambda i: torch.set_default_dtype(torch.float64 if i in (1, 2) else torch.float32))
    finally:
        torch.set_default_dtype(torch.float32)


class _MkldnnFlag(Function):
    @staticmethod
    def forward(ctx, t):
        return t * (2.0 if torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled else 3.0)

    @staticmethod
    def backward(ctx, g):
        return g * (2.0 if torch.backends.mkldnn.enabled else 3.0)


def test_backends_mkldnn_enabled_flag_toggled():
    """forward and backward read torch.backends.mkldnn.enabled; the caller toggles it."""
    def between(i):
        torch.backends.mkldnn.enabled = i % 2 == 0

    def mid(i):
        if i == 2:
            torch.backends.mkldnn.enabled = False

    try:
        _matches_eager(_MkldnnFlag, lambda i: (_fixed(i),), between=between, mid=mid)
    finally:
        torch.backends.mkldnn.enabled = True


_mkldnn = torch.backends.mkldnn


class _MkldnnAlias(Function):
    @staticmethod
    def forward(ctx, t):
        return t * (2.0 if _mkldnn.enabled else 3.0)

    @staticmethod
    def backward(ctx, g):
        return g


def test_backends_module_alias_flag_toggled():
    """A global alias of torch.backends.mkldnn; its enabled flag toggled between calls."""
    try:
        _matches_eager(_MkldnnAlias, lambda i: (_fixed(i),),
                       between=lambda i: setattr(torch.backends.mkldnn, "enabled", i % 2 == 1))
    finally:
        torch.backends.mkldnn.enabled = True


class _Tf32Flag(Function):
    @staticmethod
    def forward(ctx, t):
        fast = torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
        return t * (0.5 if fast else 1.0)

    @staticmethod
    def backward(ctx, g):
        return g


def test_float32_matmul_precision_changed_between_calls():
    """forward reads torch.get_float32_matmul_precision(); the caller sets 'high' then back."""
    try:
        _matches_eager(_Tf32Flag, lambda i: (_fixed(i),),
                       between=lambda i: torch.set_float32_matmul_precision("high" if i == 1 else "highest"))
    finally:
        torch.set_float32_matmul_precision("highest")


class _DeterministicBackward(Function):
    @staticmethod
    def forward(ctx, t):
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * (1.0 if torch.are_deterministic_algorithms_enabled() else 2.0)


def test_deterministic_flag_changed_before_backward():
    """backward reads the deterministic-algorithms flag the caller flips before .backward()."""
    try:
        _matches_eager(_DeterministicBackward, lambda i: (_fixed(i),),
                       mid=lambda i: torch.use_deterministic_algorithms(i % 2 == 1),
                       between=lambda i: torch.use_deterministic_algorithms(False))
    finally:
        torch.use_deterministic_algorithms(False)


class _DeterministicWarnOnly(Function):
    @staticmethod
    def forward(ctx, t):
        return t * (3.0 if torch.is_deterministic_algorithms_warn_only_enabled() else 1.0)

    @staticmethod
    def backward(ctx, g):
        return g


def test_deterministic_warn_only_flag_between_calls():
    """forward reads is_deterministic_algorithms_warn_only_enabled(); the caller toggles warn_only."""
    try:
        _matches_eager(_DeterministicWarnOnly, lambda i: (_fixed(i),),
                       between=lambda i: torch.use_deterministic_algorithms(i > 0, warn_only=i % 2 == 1))
    finally:
        torch.use_deterministic_algorithms(False)


def test_autocast_around_the_call_toggled():
    """The caller runs some calls under torch.autocast('cpu', bfloat16): matmul autocasts."""
    def make(i):
        return (_fixed(i), torch.linspace(0.1, 1.3, 20).reshape(4, 5).requires_grad_())

    state = {"on": False}

    class F(Function):
        @staticmethod
        def forward(ctx, a, b):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=state["on"]):
                out = a @ b
            ctx.save_for_backward(a, b)
            return out.float()

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            return g @ b.t(), a.t() @ g

    _matches_eager(F, make, between=lambda i: state.update(on=i % 2 == 1),
                   reset=lambda: state.update(on=False))


class _AutocastQuery(Function):
    @staticmethod
    def forward(ctx, t):
        return t * (2.0 if torch.is_autocast_enabled("cpu") else 1.0)

    @staticmethod
    def backward(ctx, g):
        return g


def test_is_autocast_enabled_read_in_forward():
    """forward branches on torch.is_autocast_enabled('cpu'); some calls run under autocast."""
    class Call:
        k = 0

    def between(i):
        Call.k = i

    class Wrap(Function):
        @staticmethod
        def forward(ctx, t):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=Call.k % 2 == 1):
                return _AutocastQuery.apply(t)

        @staticmethod
        def backward(ctx, g):
            return g

    _matches_eager(Wrap, lambda i: (_fixed(i),), between=between)


class _CustomFwd(Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx, t):
        ctx.dt = t.dtype
        return t * 2.0

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, g):
        return g * 2.0


def test_amp_custom_fwd_custom_bwd_decorators():
    """torch.amp.custom_fwd(cast_inputs=float32)/custom_bwd decorators (apex/xformers style)."""
    _matches_eager(_CustomFwd, lambda i: (_fixed(i),))


# -- Python attributes on tensors, equal-but-different arguments ------------------------------

class _TensorAttr(Function):
    @staticmethod
    def forward(ctx, t):
        return t * getattr(t, "_scale", 1.0)

    @staticmethod
    def backward(ctx, g):
        return g


def test_python_attribute_on_input_tensor_read_in_forward():
    """The caller sets a Python attribute t._scale on the input (some calls); forward reads it."""
    def make(i):
        t = _fixed(i)
        if i % 2:
            t._scale = 3.0 + i
        return (t,)

    _matches_eager(_TensorAttr, make)


class _TagOutput(Function):
    @staticmethod
    def forward(ctx, t, tag):
        out = t * 2.0
        out.tag = tag
        return out

    @staticmethod
    def backward(ctx, g):
        return g * 2.0, None


def test_python_attribute_set_on_output_tensor():
    """forward sets out.tag on its output; the caller reads it (every mode, each call's tag)."""
    _matches_eager(_TagOutput, lambda i: (_fixed(i), f"tag{i}"))
    for mode in eager_modes.MODES:
        minihop.reset()
        call = eager_modes.caller(mode, _TagOutput)
        for k in range(3):
            assert getattr(call(_fixed(k), f"t{k}"), "tag", None) == f"t{k}", mode


class _AlwaysEqual:
    def __init__(self, v: float) -> None:
        self.v = v

    def __eq__(self, other):
        return isinstance(other, _AlwaysEqual)

    def __hash__(self):
        return 0


class _EqualArg(Function):
    @staticmethod
    def forward(ctx, t, k):
        return t * k.v

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_argument_objects_equal_and_hash_alike_but_differ():
    """Fresh objects per call that compare equal and hash alike, with another .v each call."""
    _matches_eager(_EqualArg, lambda i: (_fixed(i), _AlwaysEqual(1.0 + i)))


class _Scale(float):
    def __mul__(self, other):
        return other * float(self) * 2.0

    __rmul__ = __mul__


class _FloatSubclass(Function):
    @staticmethod
    def forward(ctx, t, s):
        return t * s

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_float_subclass_equal_to_plain_float():
    """A float subclass overriding __mul__ (equal to 2.0) and the plain 2.0 alternate."""
    _matches_eager(_FloatSubclass, lambda i: (_fixed(i), _Scale(2.0) if i % 2 else 2.0))


class _StrMode(str):
    pass


class _StrSub(Function):
    @staticmethod
    def forward(ctx, t, mode):
        return t * (3.0 if isinstance(mode, _StrMode) else 1.0)

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_str_subclass_equal_to_plain_str():
    """A str subclass equal to 'sum' and the plain 'sum' alternate; forward checks the type."""
    _matches_eager(_StrSub, lambda i: (_fixed(i), _StrMode("sum") if i % 2 else "sum"))


class _Plain:
    pass


_KIND: Any = None


class _AbcArg(Function):
    @staticmethod
    def forward(ctx, t, obj):
        return t * (2.0 if isinstance(obj, _KIND) else 1.0)

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_abc_register_between_calls_changes_isinstance():
    """Kind.register(cls) between calls makes isinstance(obj, Kind) true for the same object."""
    obj = _Plain()

    def reset():
        global _KIND

        class Kind(abc.ABC):
            pass

        _KIND = Kind

    _matches_eager(_AbcArg, lambda i: (_fixed(i), obj), between=lambda i: _KIND.register(_Plain) if i == 2 else None,
                   reset=reset)


class _HasAttr(Function):
    @staticmethod
    def forward(ctx, t, obj):
        return t * obj.bias if hasattr(obj, "bias") else t

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_hasattr_branch_attribute_added_and_deleted():
    """hasattr(obj, 'bias') branch; the attribute is added then deleted between calls."""
    obj = _Holder(1.0)

    def between(i):
        if i == 1:
            obj.bias = 3.0
        if i == 3:
            del obj.bias

    _matches_eager(_HasAttr, lambda i: (_fixed(i), obj), between=between,
                   reset=lambda: obj.__dict__.pop("bias", None))


_BY_ID: dict = {}


class _IdCache(Function):
    @staticmethod
    def forward(ctx, t, obj):
        if id(obj) not in _BY_ID:
            _BY_ID[id(obj)] = obj.v
        return t * _BY_ID[id(obj)]

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_cache_keyed_on_id_of_argument():
    """A global cache keyed on id(obj): the same object's changed value stays cached (as eager)."""
    obj = _Holder(2.0)
    _matches_eager(_IdCache, lambda i: (_fixed(i), obj), between=lambda i: setattr(obj, "v", 2.0 + i),
                   reset=_BY_ID.clear)


# -- nn.Module state along new paths ----------------------------------------------------------

class _ModDict(Function):
    @staticmethod
    def forward(ctx, t, mods, key):
        with torch.no_grad():
            return mods[key](t) * 1.0

    @staticmethod
    def backward(ctx, g):
        return g, None, None


def test_module_dict_entry_replaced_between_calls():
    """An nn.ModuleDict argument; the entry under the key is replaced between calls."""
    mods = nn.ModuleDict({"act": nn.ReLU(), "norm": nn.Identity()})
    acts = [nn.ReLU(), nn.Tanh(), nn.Tanh(), nn.Softsign()]
    _matches_eager(_ModDict, lambda i: (_fixed(i), mods, "act" if i != 1 else "norm"),
                   between=lambda i: mods.__setitem__("act", acts[i]))


def test_module_apply_changes_eps_of_every_norm():
    """model.apply(fn) sets eps on every GroupNorm inside a held Sequential between calls."""
    model = nn.Sequential(nn.GroupNorm(1, 3, affine=False), nn.GroupNorm(1, 3, affine=False))

    class F(Function):
        @staticmethod
        def forward(ctx, t):
            with torch.no_grad():
                return model(t) * 1.0

        @staticmethod
        def backward(ctx, g):
            return g

    def set_eps(eps):
        def fn(m):
            if isinstance(m, nn.GroupNorm):
                m.eps = eps
        model.apply(fn)

    _matches_eager(F, lambda i: (_fixed(i),), between=lambda i: set_eps([1e-5, 1.0, 1.0, 10.0][i]),
                   reset=lambda: set_eps(1e-5))


class _TrainingInBackward(Function):
    @staticmethod
    def forward(ctx, t, holder):
        ctx.holder = holder
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        mods = ctx.holder["mods"]
        return g * (2.0 if mods[0].training else 0.5), None


def test_module_in_dict_on_ctx_training_flipped_before_backward():
    """backward reads holder['mods'][0].training; the caller calls .eval() before backward."""
    drop = nn.Dropout(0.1)
    holder = {"mods": [drop]}
    _matches_eager(_TrainingInBackward, lambda i: (_fixed(i), holder),
                   between=lambda i: drop.train(), mid=lambda i: drop.train(i % 2 == 0))


def test_forward_pre_hook_changing_input_registered_between_calls():
    """A forward pre-hook (input scaled by a dict value) registered on a module after call 1."""
    lin = nn.Linear(4, 4)
    table = {"k": 2.0}
    handles: list = []

    class F(Function):
        @staticmethod
        def forward(ctx, t, m):
            with torch.no_grad():
                return m(t)

        @staticmethod
        def backward(ctx, g):
            return g, None

    def between(i):
        table["k"] = 2.0 + i
        if i == 1:
            handles.append(lin.register_forward_pre_hook(lambda mod, inp: (inp[0] * table["k"],)))

    def reset():
        while handles:
            handles.pop().remove()

    _matches_eager(F, lambda i: (_fixed(i), lin), between=between, reset=reset)


def test_module_dtype_changed_by_double_between_calls():
    """A held Linear converted with .double() then .float() between calls."""
    lin = nn.Linear(4, 4)

    class F(Function):
        @staticmethod
        def forward(ctx, t):
            with torch.no_grad():
                w = lin.weight
                return (t.to(w.dtype) @ w.t()).float() + (w.dtype == torch.float64)

        @staticmethod
        def backward(ctx, g):
            return g @ lin.weight.float()

    _matches_eager(F, lambda i: (_fixed(i),), between=lambda i: lin.double() if i == 2 else lin.float(),
                   reset=lin.float)


# -- callables, partials and iterators --------------------------------------------------------

class _PartialArg(Function):
    @staticmethod
    def forward(ctx, t, fn):
        return fn(t)

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_partial_keywords_dict_mutated_in_place():
    """functools.partial(torch.add, alpha=1.0): its .keywords dict is mutated between calls."""
    p = functools.partial(torch.add, other=torch.ones(4), alpha=1.0)
    _matches_eager(_PartialArg, lambda i: (_fixed(i), p),
                   between=lambda i: p.keywords.__setitem__("alpha", 1.0 + i),
                   reset=lambda: p.keywords.__setitem__("alpha", 1.0))


class _Poly:
    def __init__(self) -> None:
        self.coefs = [1.0, 2.0]

    def apply(self, t):
        return sum(c * t ** k for k, c in enumerate(self.coefs))


def test_partial_of_bound_method_object_list_changed():
    """functools.partial of a bound method; the object's list grows between calls."""
    poly = _Poly()
    p = functools.partial(poly.apply)
    _matches_eager(_PartialArg, lambda i: (_fixed(i), p), between=lambda i: poly.coefs.append(0.5 * i),
                   reset=lambda: setattr(poly, "coefs", [1.0, 2.0]))


class _Gen(Function):
    @staticmethod
    def forward(ctx, t, gen):
        scale = next(gen)
        ctx.more = next(gen)
        return t * scale

    @staticmethod
    def backward(ctx, g):
        return g * ctx.more, None


def test_generator_object_reused_across_calls():
    """One generator passed every call: each call draws two values from it."""
    def values():
        k = 1.0
        while True:
            yield k
            k += 0.5

    box: list = []

    def reset():
        box[:] = [values()]

    _matches_eager(_Gen, lambda i: (_fixed(i), box[0]), reset=reset)


class _IterDict(Function):
    @staticmethod
    def forward(ctx, t, weights):
        out = t
        for k, (name, w) in enumerate(weights.items()):
            out = out * w + k
        return out

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_dict_insertion_order_changes_between_calls():
    """A dict with the same items in another insertion order: forward's loop order differs."""
    def make(i):
        items = [("a", 2.0), ("b", 0.5)]
        return (_fixed(i), dict(items if i % 2 == 0 else items[::-1]))

    _matches_eager(_IterDict, make)


FLAGS: set = set()


class _SetFlags(Function):
    @staticmethod
    def forward(ctx, t):
        return t * (2.0 if "fast" in FLAGS else 1.0)

    @staticmethod
    def backward(ctx, g):
        return g * (3.0 if "slow_grad" in FLAGS else 1.0)


def test_global_set_of_flags_changed_between_and_mid():
    """A global set of feature flags read in forward and backward; added and removed."""
    def between(i):
        FLAGS.clear()
        if i in (1, 3):
            FLAGS.add("fast")

    _matches_eager(_SetFlags, lambda i: (_fixed(i),), between=between,
                   mid=lambda i: FLAGS.add("slow_grad") if i >= 2 else None, reset=FLAGS.clear)


class _Globals(Function):
    @staticmethod
    def forward(ctx, t, name):
        return t * globals()[name]

    @staticmethod
    def backward(ctx, g):
        return g, None


ALPHA = 2.0
BETA = 3.0


def test_globals_dict_lookup_with_argument_name():
    """globals()[name] with the name passed in; the value changes between calls."""
    def between(i):
        global ALPHA
        ALPHA = 2.0 + (i == 3)

    def reset():
        global ALPHA
        ALPHA = 2.0

    _matches_eager(_Globals, lambda i: (_fixed(i), "ALPHA" if i != 1 else "BETA"), between=between,
                   reset=reset)


class _Vars(Function):
    @staticmethod
    def forward(ctx, t, obj):
        return t * sum(v for v in vars(obj).values() if isinstance(v, float))

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_vars_of_argument_object_grows():
    """sum over vars(obj).values(); the caller adds attributes between calls."""
    obj = _Holder(1.0)

    def between(i):
        setattr(obj, f"extra{i}", 0.5)

    def reset():
        obj.__dict__.clear()
        obj.v = 1.0

    _matches_eager(_Vars, lambda i: (_fixed(i), obj), between=between, reset=reset)


# -- randomness -------------------------------------------------------------------------------

class _GenOnObject(Function):
    @staticmethod
    def forward(ctx, t, cfg):
        mask = torch.rand(t.shape, generator=cfg.gen) > 0.5
        ctx.save_for_backward(mask)
        return t * mask

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        return g * mask, None


def test_generator_held_by_config_object_reseeded_between_calls():
    """A torch.Generator kept as cfg.gen, reseeded (some calls) and replaced between calls."""
    cfg = _Holder(0.0)

    def between(i):
        if i == 1:
            cfg.gen.manual_seed(123)
        if i == 3:
            cfg.gen = torch.Generator().manual_seed(7)

    def reset():
        cfg.gen = torch.Generator().manual_seed(0)

    _matches_eager(_GenOnObject, lambda i: (_x(i), cfg), between=between, reset=reset)


class _PyRandom(Function):
    @staticmethod
    def forward(ctx, t, rng):
        ctx.k = rng.uniform(0.5, 1.5)
        return t * rng.choice([1.0, 2.0, 3.0])

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k, None


def test_random_random_instance_passed_in():
    """A random.Random instance argument: choice and uniform advance its state every call."""
    import random
    box: list = []
    _matches_eager(_PyRandom, lambda i: (_fixed(i), box[0]),
                   reset=lambda: box.__setitem__(slice(None), [random.Random(5)]))


class _ForkInBackward(Function):
    @staticmethod
    def forward(ctx, t):
        ctx.state = torch.get_rng_state()
        return t * (torch.rand(t.shape) > 0.3)

    @staticmethod
    def backward(ctx, g):
        with torch.random.fork_rng():
            torch.set_rng_state(ctx.state)
            mask = torch.rand(g.shape) > 0.3
        return g * mask


def test_rng_state_restored_inside_fork_rng_in_backward_caller_draws_mid():
    """backward replays forward's mask inside fork_rng; the caller draws between forward and backward."""
    _matches_eager(_ForkInBackward, lambda i: (_fixed(i),), mid=lambda i: torch.rand(i + 1))


class _BernoulliGen(Function):
    @staticmethod
    def forward(ctx, t, p):
        g = torch.Generator()
        g.manual_seed(int(p * 1000))
        keep = torch.bernoulli(torch.full(t.shape, 1 - p), generator=g)
        ctx.save_for_backward(keep)
        return t * keep / (1 - p)

    @staticmethod
    def backward(ctx, g):
        (keep,) = ctx.saved_tensors
        return g * keep / 0.5, None


def test_generator_seeded_from_float_argument():
    """A Generator seeded inside forward from int(p * 1000), p changing per call."""
    _matches_eager(_BernoulliGen, lambda i: (_fixed(i), [0.5, 0.25, 0.5, 0.125][i]))


# -- caches -----------------------------------------------------------------------------------

class _Table:
    def __init__(self) -> None:
        self.base = 2.0

    @functools.lru_cache(maxsize=None)  # noqa: B019  (cache on a method, as users write it)
    def ramp(self, n):
        return torch.arange(float(n)) * self.base


class _MethodCache(Function):
    @staticmethod
    def forward(ctx, t, table):
        return t * table.ramp(t.shape[-1])

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_lru_cache_on_method_stale_after_attribute_change():
    """lru_cache on a method (keyed on self): base changes, eager keeps the cached ramp."""
    table = _Table()

    def reset():
        _Table.ramp.cache_clear()
        table.base = 2.0

    _matches_eager(_MethodCache, lambda i: (_fixed(i), table), between=lambda i: setattr(table, "base", 2.0 + i),
                   reset=reset)


_MASKS: collections.OrderedDict = collections.OrderedDict()


class _LruDict(Function):
    @staticmethod
    def forward(ctx, t, n):
        if n not in _MASKS:
            _MASKS[n] = torch.full((4,), float(n))
            if len(_MASKS) > 2:
                _MASKS.popitem(last=False)
        ctx.n = n
        return t * _MASKS[n]

    @staticmethod
    def backward(ctx, g):
        m = _MASKS.get(ctx.n)
        return (g * m if m is not None else g), None


def test_hand_written_lru_ordered_dict_evicts():
    """A hand-written LRU (OrderedDict, popitem(last=False)); backward reads the maybe-evicted entry."""
    _matches_eager(_LruDict, lambda i: (_fixed(i), [1, 2, 3, 1][i]),
                   mid=lambda i: _MASKS.pop(1, None) if i == 3 else None,
                   state=lambda: list(_MASKS), reset=_MASKS.clear)


class _PureFactor(Function):
    @staticmethod
    @functools.lru_cache(maxsize=4)
    def factor(n):
        return 0.5 * n

    @staticmethod
    def forward(ctx, t):
        return t * _PureFactor.factor(t.shape[-1])

    @staticmethod
    def backward(ctx, g):
        return g * _PureFactor.factor(g.shape[0])


def test_lru_cached_staticmethod_helper_stays_on_the_class():
    """An lru_cache'd staticmethod on the Function class: tracing leaves the class's own entry as it was."""
    stored = vars(_PureFactor)["factor"]
    _matches_eager(_PureFactor, lambda i: (_fixed(i),), reset=_PureFactor.factor.cache_clear)
    assert vars(_PureFactor)["factor"] is stored


# -- ctx written in backward, several backwards ----------------------------------------------


class _CtxSavedDictInBackward(Function):
    @staticmethod
    def forward(ctx, t, log):
        ctx.log = log
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        ctx.log["bwd"] = ctx.log.get("bwd", 0) + 1
        return g * ctx.log["bwd"], None


def test_argument_dict_on_ctx_written_in_backward_read_by_caller():
    """backward counts into an argument dict kept on ctx; two backwards per call."""
    log: dict = {}
    _matches_eager(_CtxSavedDictInBackward, lambda i: (_fixed(i), log), backwards=2,
                   state=lambda: dict(log), reset=log.clear)


# -- exceptions, warnings, logging ------------------------------------------------------------

_SEEN: collections.deque = collections.deque(maxlen=2)


class _RaiseAfterDeque(Function):
    @staticmethod
    def forward(ctx, t, k):
        _SEEN.append(k)
        if k == 2:
            raise OverflowError(f"k={k} too large after {list(_SEEN)}")
        return t * k

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_exception_after_deque_append():
    """forward appends to a global deque(maxlen=2) then raises OverflowError on one call."""
    _matches_eager(_RaiseAfterDeque, lambda i: (_fixed(i), [1, 2, 3, 2][i]), state=lambda: list(_SEEN),
                   reset=_SEEN.clear)


@contextlib.contextmanager
def _tracking(log):
    log.append("enter")
    try:
        yield
    finally:
        log.append("exit")


class _RaiseInsideCm(Function):
    @staticmethod
    def forward(ctx, t, log, bad):
        with _tracking(log):
            if bad:
                raise ValueError("bad input")
            out = t * 2.0
        return out

    @staticmethod
    def backward(ctx, g):
        return g * 2.0, None, None


def test_exception_inside_contextmanager_whose_finally_writes():
    """A @contextmanager's finally appends 'exit' even when the body raises ValueError."""
    log: list = []
    _matches_eager(_RaiseInsideCm, lambda i: (_fixed(i), log, i == 1), state=lambda: list(log),
                   reset=log.clear)


class _RaiseInBackwardAfterWrite(Function):
    @staticmethod
    def forward(ctx, t, cfg):
        ctx.cfg = cfg
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        ctx.cfg.v += 1.0
        if ctx.cfg.v > 2.5:
            raise ZeroDivisionError(f"v={ctx.cfg.v}")
        return g, None


def test_exception_in_backward_after_writing_argument_attribute():
    """backward writes cfg.v then raises ZeroDivisionError once it passes a bound."""
    cfg = _Holder(0.0)
    _matches_eager(_RaiseInBackwardAfterWrite, lambda i: (_fixed(i), cfg), state=lambda: cfg.v,
                   reset=lambda: setattr(cfg, "v", 0.0))


class _RuntimeWarningClass(UserWarning):
    pass


class _WarnStacklevel(Function):
    @staticmethod
    def forward(ctx, t, k):
        if k > 1:
            warnings.warn(_RuntimeWarningClass(f"k={k} clipped"), stacklevel=2)
        return t * min(k, 1)

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_warning_instance_of_custom_category_with_stacklevel():
    """warnings.warn(CustomWarning(msg), stacklevel=2) on some calls, with the call's value."""
    _matches_eager(_WarnStacklevel, lambda i: (_fixed(i), [1, 2, 3, 1][i]))


class _WarnInBackwardFromCtx(Function):
    @staticmethod
    def forward(ctx, t, name):
        ctx.name = name
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        warnings.warn(f"backward of {ctx.name} with grad norm {float(g.norm()):.3f}")
        return g, None


def test_warning_in_backward_with_ctx_string_and_grad_value():
    """backward warns with a string from ctx and a number computed from g."""
    _matches_eager(_WarnInBackwardFromCtx, lambda i: (_x(i), f"layer{i}"))


_CHILD_LOG = logging.getLogger("minihop.tests.hostile.child")


class _LogChild(Function):
    @staticmethod
    def forward(ctx, t):
        _CHILD_LOG.warning("shape %s mean %.3f", tuple(t.shape), float(t.mean()))
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        _CHILD_LOG.info("grad done")
        return g


def test_child_logger_propagating_to_parent_handler():
    """A child logger's warning/info propagate to the parent's handler; its level changes between calls."""
    def between(i):
        _CHILD_LOG.setLevel(logging.WARNING if i == 2 else logging.NOTSET)

    _matches_eager(_LogChild, lambda i: (_x(i),), between=between,
                   reset=lambda: _CHILD_LOG.setLevel(logging.NOTSET))


class _LogFilter(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.on = True

    def filter(self, record):
        return self.on


_FILTER = _LogFilter()


class _LogFiltered(Function):
    @staticmethod
    def forward(ctx, t):
        LOG.info("forward %d", t.shape[0])
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        return g


def test_log_filter_switched_between_calls():
    """A logging.Filter on the logger, switched off between calls: fewer records, as eager."""
    LOG.addFilter(_FILTER)
    try:
        _matches_eager(_LogFiltered, lambda i: (_fixed(i),), between=lambda i: setattr(_FILTER, "on", i != 1),
                       reset=lambda: setattr(_FILTER, "on", True))
    finally:
        LOG.removeFilter(_FILTER)


# -- cyclic objects, enums, records -----------------------------------------------------------

class _Node:
    def __init__(self, v: float) -> None:
        self.v = v
        self.next: Any = None
        self.prev: Any = None


class _RingOnCtx(Function):
    @staticmethod
    def forward(ctx, t, head):
        ctx.head = head
        return t * head.next.v

    @staticmethod
    def backward(ctx, g):
        return g * ctx.head.prev.v, None


def test_doubly_linked_ring_on_ctx_changed_before_backward():
    """A two-node ring (next/prev cycle) kept on ctx; the caller edits the other node mid."""
    a, b = _Node(2.0), _Node(3.0)
    a.next = a.prev = b
    b.next = b.prev = a
    _matches_eager(_RingOnCtx, lambda i: (_fixed(i), a), between=lambda i: setattr(b, "v", 3.0),
                   mid=lambda i: setattr(b, "v", -1.0 - i))


class _Mode(enum.Flag):
    SCALE = enum.auto()
    SHIFT = enum.auto()


class _FlagEnum(Function):
    @staticmethod
    def forward(ctx, t, mode):
        out = t
        if _Mode.SCALE in mode:
            out = out * 2.0
        if _Mode.SHIFT in mode:
            out = out + 1.0
        return out

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_enum_flag_combinations():
    """An enum.Flag argument: SCALE, SHIFT, SCALE|SHIFT, none."""
    modes = [_Mode.SCALE, _Mode.SCALE | _Mode.SHIFT, _Mode(0), _Mode.SHIFT]
    _matches_eager(_FlagEnum, lambda i: (_fixed(i), modes[i]))


class _Temp(enum.Enum):
    COLD = 0.5
    HOT = 2.0


class _EnumValue(Function):
    @staticmethod
    def forward(ctx, t, temp):
        ctx.temp = temp
        return t * temp.value

    @staticmethod
    def backward(ctx, g):
        return g * ctx.temp.value, None


def test_float_valued_enum_argument():
    """An Enum whose members' values are floats; the member alternates."""
    _matches_eager(_EnumValue, lambda i: (_fixed(i), _Temp.HOT if i % 2 else _Temp.COLD))


class _Pair(NamedTuple):
    w: torch.Tensor
    k: float


class _NamedTupleTensor(Function):
    @staticmethod
    def forward(ctx, t, p):
        ctx.p = p
        return t * p.w * p.k

    @staticmethod
    def backward(ctx, g):
        return g * ctx.p.w, None


def test_named_tuple_with_tensor_field_inplace_edit_mid():
    """A NamedTuple (tensor, float) kept on ctx; its tensor edited in place before backward."""
    w = torch.full((4,), 2.0)

    def make(i):
        w.fill_(2.0)
        return (_fixed(i), _Pair(w, 1.0 + i))

    _matches_eager(_NamedTupleTensor, make, mid=lambda i: w.mul_(3.0) if i % 2 else None)


class _FloatKeyTuple(Function):
    @staticmethod
    def forward(ctx, t, table):
        (k, v), = table.items()
        return t * math.copysign(v, k[1])

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_dict_with_tuple_key_holding_signed_zero():
    """A dict keyed by (1, 0.0) then (1, -0.0): forward reads the key's sign."""
    _matches_eager(_FloatKeyTuple, lambda i: (_fixed(i), {(1, 0.0 if i % 2 == 0 else -0.0): 2.0}))


class _NanList(Function):
    @staticmethod
    def forward(ctx, t, xs):
        return t * sum(0.0 if math.isnan(x) else x for x in xs)

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_list_with_nan_then_number():
    """A list [nan, 1.0] then [2.0, 1.0] then the same nan object again."""
    nan = float("nan")
    _matches_eager(_NanList, lambda i: (_fixed(i), [nan, 1.0] if i % 2 == 0 else [2.0, 1.0]))
