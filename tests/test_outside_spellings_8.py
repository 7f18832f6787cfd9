"""Hostile spellings, round 8 (issue #28, round 13): the issue's classes written in ways the
suite had not seen, tried from outside against eager in strict, apply and fallback mode
(``eager_modes.matches_eager``).

Silent differences from eager before this round, in every mode:

- a set's iteration order: ``{9, 1}`` and ``{1, 9}`` are equal and hash alike, yet iterate in
  another order (they collide in an 8-slot table), so code looping over a set argument or a
  global ``frozenset`` stacked its outputs in the first call's order. A set's key is now its
  members in iteration order (``runtime.guards.value_key``);
- a tensor's flags no call key held: ``x.is_inference()``, and ``is_conj()`` of a view forward
  makes of a conjugate argument (``x[:1].is_conj()``); and a *backward* that reads the strides
  of a saved input (``x.is_contiguous()``, ``x.stride(0)``) hit a capture traced for another
  layout. Any question of a traced tensor that its key does not answer (an allowlist,
  ``tracer.identity.KEY_HELD``), in forward or backward, now guards the arguments' strides and
  flags (``runtime.assumptions.layout_key``); of a tensor reached outside the arguments, the
  capture is single-use;
- the user's own decorator on forward or backward (``functools.wraps`` wrappers, a callable
  object with ``__wrapped__``): the analysis unwrapped to the innermost function, so what the
  wrapper read (a global, its closure's config, its own attribute, a call counter) was never
  watched. Each user wrapper layer is now analysed as well (``tracer.roots.wrapper_layers``);
- ``vars(x)``, ``x.__dict__`` and ``dir(x)`` of a traced tensor: the fake copy's listing (the
  tracer's own entries, FakeTensor's methods). ``vars``/``dir`` are now stand-ins refusing a
  fake (``identity.VARS``/``DIR``); ``.__dict__`` is refused but of ``self``/``cls``;
- code no analysis reached, called while traced (a callback in a list or dict passed in, one
  reached through ``operator.methodcaller``, ``type(h).k``, a computed name): its capture was
  single-use, but the trace was not eager's for that call: ``isinstance(n, int)`` of a
  symbolic size False, ``str(x)`` the fake's text, ``x.__class__`` FakeTensor. The call watch
  now binds the stand-ins in such code's globals when it is called and refuses its text of a
  tensor, its ``id()``/``hash()`` of one, and what ``kinds`` refuses in analysed code
  (``call_watch.CallWatch``);
- a torch function or dispatch mode active at the call (a user's op counter): it saw the
  tracer's fake tensors and bookkeeping on the first call and the graphs' calls after, not
  eager's ops. Refused now (``run_context.observing_modes``; fallback runs eagerly), torch's
  default-device context excepted;
- a function forward defines (a lambda, an inner def, one a helper returns) kept on ctx and
  called by backward: what it reads (a global, an argument's attribute through a captured
  parameter) was guarded as forward's read, though eager reads it when backward runs. Such
  reads are backward's too now (``chains.Chain.deferred``); likewise a user function forward
  hands on without calling it (``ctx.fn = helper``, ``partial(helper)``: ``Chain.handed``);
- a method that is no function (``forward = staticmethod(functools.partial(impl, k=2.0))``,
  ``staticmethod(Impl())``): no code was found for it, so nothing it read was watched. A
  partial is now its function (its args and keywords read places), a callable object its
  ``__call__`` with ``self`` bound; a method of no analysable code makes the capture single-use;
- a helper reached through a bound ``self``/``cls`` (``cls._helper(x)`` in a classmethod
  forward, ``self.fn(*a)`` in a callable object's ``__call__``): not followed by the analysis
  (the first was single-use, the second's reads were found only while traced). Now analysed;
- an op inside the user's ``try``/``except RuntimeError`` (``cholesky``, ``inv``,
  ``multinomial``, ``_assert_async`` failing for some values, the handler taking another
  path; likewise ``with contextlib.suppress(RuntimeError):`` or a manager whose ``__exit__``
  returns true): a fake never raises there, so the capture took the ``try`` path and raised
  where eager recovers. Refused (``tracer/handlers.py``, MH104-op-in-try); and a refusal the user's own
  ``except`` caught (``str(x)``, ``vars(x)``) is raised when the phase returns;
- an inference tensor as an argument (made under ``torch.inference_mode()``, used outside it):
  the tracer read its version counter, which inference tensors lack, and failed inside minihop
  (strict ran it eagerly with a "bug in minihop" warning). Its counter is now read as absent.

The rest passed when written and stay as the round's evidence.
"""

from __future__ import annotations

import builtins
import collections
import functools
import types
import warnings

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import minihop
from eager_modes import matches_eager


def x_(i):
    return (torch.linspace(-1, 1, 4) + i).requires_grad_()


def _set(order):
    s = set()
    for v in order:
        s.add(v)
    return s


# -- set iteration order --------------------------------------------------------------------

def test_set_argument_iterated_in_its_own_order():
    class Stack(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, scales):
            return torch.stack([x * v for v in scales])

        @staticmethod
        def backward(ctx, g):
            return g.sum(0), None

    assert list(_set((9, 1))) != list(_set((1, 9)))  # (what makes the case: equal, other order)
    matches_eager(Stack, lambda i: (x_(i), _set((1, 9) if i % 2 else (9, 1))))


FS = frozenset([9, 1])


def test_global_frozenset_rebuilt_in_another_order():
    class Stack(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.stack([x * v for v in FS])

        @staticmethod
        def backward(ctx, g):
            return g.sum(0)

    def between(i):
        global FS
        FS = frozenset([1, 9]) if i % 2 else frozenset([9, 1])

    matches_eager(Stack, lambda i: (x_(i),), between=between)


def test_set_popped_in_forward():
    class Pop(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, s):
            first = set(s).pop()
            return x * first

        @staticmethod
        def backward(ctx, g):
            return g * 2, None

    matches_eager(Pop, lambda i: (x_(i), _set((1, 9) if i % 2 else (9, 1))))


def test_dict_in_another_insertion_order():
    class Stack(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, cfg):
            return torch.stack([x * v for v in cfg.values()])

        @staticmethod
        def backward(ctx, g):
            return g.sum(0), None

    matches_eager(Stack, lambda i: (x_(i), {"a": 1.0, "b": 2.0} if i % 2 else {"b": 2.0, "a": 1.0}))


# -- tensor flags and layouts no key held -------------------------------------------------

def _inference(value):
    with torch.inference_mode():
        return torch.full((4,), float(value))


def test_is_inference_of_an_argument():
    class Branch(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            return x * (2.0 if w.is_inference() else 3.0)

        @staticmethod
        def backward(ctx, g):
            return g, None

    matches_eager(Branch, lambda i: (x_(i), _inference(1.0) if i % 2 else torch.ones(4)))


GW = [torch.ones(4)]


def test_is_inference_of_a_global_tensor():
    class Branch(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * (2.0 if GW[0].is_inference() else 3.0)

        @staticmethod
        def backward(ctx, g):
            return g

    def between(i):
        GW[0] = _inference(1.0) if i % 2 else torch.ones(4)

    matches_eager(Branch, lambda i: (x_(i),), between=between)


def _maybe_conj(i):
    base = torch.tensor([1 + 1j, 2 - 1j]) * (i + 1)
    return ((base.conj() if i % 2 else base.clone()).requires_grad_(),)


def test_conj_bit_of_a_view_forward_makes():
    class Branch(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return (x * (2.0 if x[:1].is_conj() else 3.0)).real

        @staticmethod
        def backward(ctx, g):
            return g.to(torch.complex64)

    matches_eager(Branch, _maybe_conj)


def test_conj_bit_of_a_saved_input_in_backward():
    class Branch(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return g * (2.0 if x.is_conj() else 3.0)

    matches_eager(Branch, _maybe_conj)


def _maybe_transposed(i):
    b = torch.ones(2, 3) * (i + 1)
    return ((b if i % 2 else b.t().contiguous().t()).requires_grad_(),)


def test_backward_reads_a_saved_input_contiguity():
    class Branch(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return g * (2.0 if x.is_contiguous() else 3.0)

    matches_eager(Branch, _maybe_transposed)


def test_backward_reads_a_saved_input_stride():
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return g * float(x.stride(0))

    matches_eager(Scale, _maybe_transposed)


def test_backward_reads_an_input_kept_on_ctx_stride():
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.x = x
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * float(ctx.x.stride(0))

    matches_eager(Scale, _maybe_transposed)


def test_layout_and_flag_guard_is_named_in_explain():
    class Branch(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            return x * (2.0 if w.is_inference() else 3.0)

        @staticmethod
        def backward(ctx, g):
            return g, None

    report = minihop.explain(Branch, x_(0), _inference(1.0))
    assert any("strides of w" in g and "an inference tensor" in g for g in report.guards), report.guards


# -- inference tensors as arguments (an internal error before) ------------------------------

def test_inference_tensor_argument_traced_without_internal_error():
    class Mul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            return x * w

        @staticmethod
        def backward(ctx, g):
            return g * 2, None

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mul = minihop.function(Mul)
        out = mul(x_(0), _inference(3.0))
    assert not [w for w in caught if "bug in minihop" in str(w.message)], [str(w.message) for w in caught]
    assert (mul.stats.captures, mul.stats.eager_calls) == (1, 0) and torch.equal(out.detach(), x_(0).detach() * 3)
    matches_eager(Mul, lambda i: (x_(i), _inference(i + 2)), refusable=False)


def test_inference_tensor_argument_saved():
    class Mul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(w)  # eager: "Inference tensors cannot be saved for backward"
            return x * w

        @staticmethod
        def backward(ctx, g):
            w, = ctx.saved_tensors
            return g * w, None

    matches_eager(Mul, lambda i: (x_(i), _inference(i + 2)), refusable=False)


def test_inference_tensor_argument_written_in_forward():
    class Write(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            w.add_(1)
            return x * w

        @staticmethod
        def backward(ctx, g):
            return g, None

    matches_eager(Write, lambda i: (x_(i), _inference(i + 2)))


# -- passed when written: names and callables reached other ways --------------------------

def test_name_found_in_builtins_then_rebound():
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * MH_ROUND13_SCALE  # noqa: F821 (found in builtins)

        @staticmethod
        def backward(ctx, g):
            return g * MH_ROUND13_SCALE  # noqa: F821

    def between(i):
        builtins.MH_ROUND13_SCALE = 1.0 + i

    try:
        matches_eager(Scale, lambda i: (x_(i),), between=between)
    finally:
        del builtins.MH_ROUND13_SCALE


def test_module_global_shadows_a_builtin_later():
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * float(max(2, 3))

        @staticmethod
        def backward(ctx, g):
            return g

    def between(i):
        if i == 2:
            globals()["max"] = lambda a, b: 10

    try:
        matches_eager(Scale, lambda i: (x_(i),), between=between, reset=lambda: globals().pop("max", None))
    finally:
        globals().pop("max", None)


def _helper(x, s=2.0):
    return x * s


def _helper_attr(x):
    return x * _helper_attr.scale


_helper_attr.scale = 2.0


def test_helper_defaults_and_function_attribute_replaced():
    class Both(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return _helper(x) + _helper_attr(x)

        @staticmethod
        def backward(ctx, g):
            return g * _helper_attr.scale

    def between(i):
        _helper.__defaults__ = (2.0 + i,)
        _helper_attr.scale = 2.0 + i

    def mid(i):
        _helper_attr.scale = 7.0 + i

    def reset():
        _helper.__defaults__ = (2.0,)
        _helper_attr.scale = 2.0

    matches_eager(Both, lambda i: (x_(i),), between=between, mid=mid, reset=reset)


def test_partial_keywords_mutated_in_place():
    p = functools.partial(_helper, s=2.0)

    class Call(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, fn):
            return fn(x)

        @staticmethod
        def backward(ctx, g):
            return g, None

    def between(i):
        p.keywords["s"] = 2.0 + i

    matches_eager(Call, lambda i: (x_(i), p), between=between)


def test_object_class_reassigned_and_property_replaced():
    class A:
        @property
        def k(self):
            return 2.0

    class B(A):
        @property
        def k(self):
            return 5.0

    o = A()

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, o):
            return x * o.k

        @staticmethod
        def backward(ctx, g):
            return g, None

    def between(i):
        o.__class__ = A if i % 2 == 0 else B
        if i == 2:
            A.k = property(lambda self: 4.0)

    original = A.k

    def reset():
        A.k = original
        o.__class__ = A

    matches_eager(Scale, lambda i: (x_(i), o), between=between, reset=reset)


def test_dunder_conversions_reading_globals():
    class Knob:
        def __index__(self):
            return KNOB["dim"]

        def __float__(self):
            return KNOB["scale"]

        def __bool__(self):
            return KNOB["on"]

    knob = Knob()

    class Use(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k):
            y = x.sum(dim=k) * float(k)
            return y * 2 if k else y

        @staticmethod
        def backward(ctx, g):
            return g.unsqueeze(KNOB["dim"]).expand(2, 3).clone(), None

    def between(i):
        KNOB.update(dim=i % 2, scale=1.0 + i, on=i < 2)

    matches_eager(Use, lambda i: (torch.ones(2, 3).requires_grad_(), knob), between=between)


KNOB = {"dim": 0, "scale": 1.0, "on": True}


def test_views_of_changing_containers():
    inner = {"s": 2.0}
    chain = collections.ChainMap({}, inner)
    proxy = types.MappingProxyType(inner)

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, cm):
            return x * cm["s"] + x * proxy["s"]

        @staticmethod
        def backward(ctx, g):
            return g, None

    def between(i):
        inner["s"] = 2.0 + i

    matches_eager(Scale, lambda i: (x_(i), chain), between=between)


def test_equal_arguments_of_other_types():
    P = collections.namedtuple("P", "a b")

    class Branch(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, p, s, c):
            k = 2.0 if hasattr(p, "_fields") else 3.0
            k += 1.0 if isinstance(s, torch.Size) else 0.0
            return x * k * abs(c) * (2.0 if isinstance(c, complex) else 1.0)

        @staticmethod
        def backward(ctx, g):
            return g, None, None, None

    matches_eager(Branch, lambda i: (x_(i), P(1, 2) if i % 2 else (1, 2),
                                     torch.Size([4]) if i % 3 else (4,), 1 + 0j if i % 2 else 1))


# -- the user's own decorators on forward/backward -----------------------------------------
# ``inspect.unwrap`` found the innermost function's code: the wrapper's own reads (a global,
# its closure's config, a call counter) were never analysed, so a change to them reused the
# capture. Each user wrapper layer is now analysed too (``tracer.roots.wrapper_layers``).

WSCALE = 2.0
WCFG = {"s": 2.0}


def _scaled(fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        return fn(*a, **k) * WSCALE
    return wrapper


def _with_cfg(cfg):
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            return fn(*a, **k) * cfg["s"]
        return wrapper
    return deco


def _set_wscale(value):
    global WSCALE
    WSCALE = value


def test_forward_wrapper_reads_a_global():
    class Scaled(torch.autograd.Function):
        @staticmethod
        @_scaled
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    matches_eager(Scaled, lambda i: (x_(i),), between=lambda i: _set_wscale(2.0 + i), reset=lambda: _set_wscale(2.0))


def test_backward_wrapper_reads_a_global_changed_before_backward():
    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        @_scaled
        def backward(ctx, g):
            return g * 2

    matches_eager(Scaled, lambda i: (x_(i),), between=lambda i: _set_wscale(2.0 + i),
                  mid=lambda i: _set_wscale(7.0 + i), reset=lambda: _set_wscale(2.0))


def test_two_wrapper_layers_one_reads_its_closure_config():
    class Scaled(torch.autograd.Function):
        @staticmethod
        @_scaled
        @_with_cfg(WCFG)
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    matches_eager(Scaled, lambda i: (x_(i),), between=lambda i: WCFG.update(s=2.0 + i), reset=lambda: WCFG.update(s=2.0))


def test_wrapper_counting_its_calls():
    def counting(fn):
        calls = [0]

        @functools.wraps(fn)
        def wrapper(*a, **k):
            calls[0] += 1
            return fn(*a, **k) * float(calls[0])
        wrapper.calls = calls
        return wrapper

    class Counted(torch.autograd.Function):
        @staticmethod
        @counting
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    matches_eager(Counted, lambda i: (x_(i),), state=lambda: Counted.forward.calls[0],
                  reset=lambda: Counted.forward.calls.__setitem__(0, 0))


def test_callable_object_decorator_attribute_changed():
    class Scale:
        def __init__(self, fn):
            self.fn, self.k = fn, 2.0
            functools.update_wrapper(self, fn)

        def __call__(self, *a):
            return self.fn(*a) * self.k

    class Scaled(torch.autograd.Function):
        @staticmethod
        @Scale
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    def between(i):
        Scaled.forward.k = 2.0 + i

    matches_eager(Scaled, lambda i: (x_(i),), between=between, reset=lambda: between(0))


def test_library_decorators_still_captured():
    class Amp(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        @torch.amp.custom_bwd(device_type="cpu")
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return g * 2 * x

    amp = minihop.function(Amp)
    for i in range(3):
        x = x_(i)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(i % 2)):
            y, e = amp(x @ torch.eye(4)), Amp.apply(x @ torch.eye(4))
        assert y.dtype == e.dtype and torch.equal(y, e)
    assert amp.stats.eager_calls == 0 and amp.stats.captures >= 1


# -- listing a tensor's attributes ---------------------------------------------------------
# ``vars(x)``, ``x.__dict__`` and ``dir(x)`` of a traced tensor gave the fake copy's listing
# (22 entries of the tracer's, 33 more methods). ``vars``/``dir`` are stand-ins that refuse a
# fake (``identity.VARS``); ``.__dict__`` is refused where the code reads it but of
# ``self``/``cls`` (``kinds``).

def _tagged(i):
    w = torch.ones(4)
    if i % 2:
        w.scale = 3.0
    else:
        w.other = 5.0
    return (x_(i), w)


def test_vars_of_a_tensor_argument():
    class Count(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            return x * float(len(vars(w)) + 1), sorted(vars(w))

        @staticmethod
        def backward(ctx, g, _):
            return g, None

    matches_eager(Count, _tagged)


def test_dict_of_a_tensor_argument():
    class Count(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            return x * float(len(w.__dict__) + 1)

        @staticmethod
        def backward(ctx, g):
            return g, None

    matches_eager(Count, _tagged)


def test_dir_of_the_input_and_of_a_saved_tensor():
    class Count(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * float(len([n for n in dir(x) if not n.startswith("_")]) % 7 + 1)

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return g * float(len(dir(x)) % 5)

    matches_eager(Count, lambda i: (x_(i),))


def test_vars_of_a_user_object_still_captured():
    class Cfg:
        def __init__(self, s):
            self.s = s

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, cfg):
            return x * vars(cfg)["s"] * float(len(dir(cfg)) > 0)

        @staticmethod
        def backward(ctx, g):
            return g * 2, None

    scale = minihop.function(Scale)
    for i in range(3):
        x = x_(i)
        assert torch.equal(scale(x, Cfg(2.0 + i)), Scale.apply(x, Cfg(2.0 + i)))
    assert scale.stats.eager_calls == 0
    matches_eager(Scale, lambda i: (x_(i), Cfg(2.0 + i % 2)), refusable=False)


# -- code no analysis reached, called while traced -------------------------------------------
# A callback found at run time (in a list or dict passed in, through ``methodcaller``, by a
# computed name) was single-use, but its trace was not eager's for that very call: under
# automatic dynamic shapes ``isinstance(n, int)`` of a size was False there, ``str(x)`` gave
# the fake's text, ``x.__class__`` was FakeTensor. The call watch now binds the stand-ins
# into such code's globals when it is called, refuses its text of a tensor, and refuses what
# ``kinds`` refuses in analysed code (``call_watch.CallWatch``).

def _kind(n):
    return 2.0 if isinstance(n, int) else 3.0


def _type_kind(n):
    return 2.0 if type(n) is int else 3.0


class _Holder:
    def k(self, n):
        return _kind(n)


def _sizes(i):
    return (torch.linspace(-1, 1, 3 + i).requires_grad_(),)


def _through(pick):
    class Pick(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, fns):
            return x * pick(x, fns)

        @staticmethod
        def backward(ctx, g):
            return g, None
    return Pick


def test_symbolic_size_to_a_callback_in_a_list():
    matches_eager(_through(lambda x, fs: fs[0](x.shape[0]) + fs[1](x.shape[0])),
                  lambda i: (*_sizes(i), [_kind, _type_kind]), steps=5)


def test_symbolic_size_to_a_callback_in_a_dict():
    matches_eager(_through(lambda x, d: d["k"](x.shape[0])), lambda i: (*_sizes(i), {"k": _kind}), steps=5)


def test_symbolic_size_through_methodcaller_and_type_method():
    import operator
    matches_eager(_through(lambda x, h: operator.methodcaller("k", x.shape[0])(h) + type(h).k(h, x.numel())),
                  lambda i: (*_sizes(i), _Holder()), steps=5)


def _text(t):
    return float(len(str(t)) % 7 + 1)


def _class_name(t):
    return float(len(t.__class__.__name__))


def _match(n):
    match n:
        case int():
            return 2.0
        case _:
            return 3.0


def test_callback_takes_a_tensors_text():
    matches_eager(_through(lambda x, fs: fs[0](x)), lambda i: (x_(i), [_text]))


def test_callback_reads_a_tensors_class():
    matches_eager(_through(lambda x, fs: fs[0](x)), lambda i: (x_(i), [_class_name]))


def test_callback_matches_a_symbolic_size():
    matches_eager(_through(lambda x, fs: fs[0](x.shape[0])), lambda i: (*_sizes(i), [_match]), steps=5)


def test_callback_still_captured_when_it_asks_nothing():
    def plain(n):
        return float(n) * 0 + 2.0

    pick = minihop.function(_through(lambda x, fs: fs[0](x.shape[0])))
    for i in range(3):
        out = pick(*_sizes(i), [plain])
        assert torch.equal(out.detach(), _sizes(i)[0].detach() * 2.0)
    assert pick.stats.eager_calls == 0


# -- torch function and dispatch modes active at the call -----------------------------------
# A mode runs the user's code on every op. Under a capture it saw minihop's tracer (fake
# tensors, bookkeeping calls) on the first call and the graphs' calls after: a dispatch mode
# counting ops counted 4 where eager's forward makes 1. Refused now (fallback: eager's); torch's
# default-device context is not such a mode (``run_context.observing_modes``).

class _CountOps(TorchDispatchMode):
    calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        _CountOps.calls += 1
        return func(*args, **(kwargs or {}))


class _Sin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * x.cos()


def _under_mode(call):
    _CountOps.calls = 0
    records = []
    for i in range(3):
        x = x_(i)
        with _CountOps():
            y = call(x)
        y.sum().backward()
        records.append((y.detach(), x.grad, _CountOps.calls))
    return records


def test_dispatch_mode_active_at_the_call():
    eager = _under_mode(_Sin.apply)
    with pytest.raises(minihop.UnsupportedOperationError, match="_CountOps"):
        _under_mode(minihop.function(_Sin))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _under_mode(minihop.function(_Sin, fallback="eager"))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2] for a, b in zip(got, eager))


def test_function_mode_active_at_the_call_and_a_hit_after_it():
    class Seen(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    sin = minihop.function(_Sin)
    sin(x_(0))  # captured outside any mode
    with Seen(), pytest.raises(minihop.UnsupportedOperationError, match="Seen"):
        sin(x_(0))  # a capture that fits is not run under the mode either
    with pytest.raises(minihop.UnsupportedOperationError, match="Seen"), Seen():
        minihop.capture(_Sin, x_(1))


def test_default_device_context_is_no_such_mode():
    sin = minihop.function(_Sin)
    with torch.device("cpu"):
        out = sin(x_(0))
    assert torch.equal(out, _Sin.apply(x_(0))) and sin.stats.captures == 1 and sin.stats.eager_calls == 0


# -- functions forward defines, called by backward -------------------------------------------
# A lambda or inner def made in forward and kept on ctx (or in a global memo), called by
# backward: what it reads (a global, an argument's attribute) was guarded as forward's read,
# checked at the call, though eager reads it when backward runs. Such reads are backward's too
# now (``chains.Chain.deferred``; a captured parameter is the argument: ``roots.resolve_root``).

SCALE8 = {"s": 2.0}


def _set_scale(value):
    SCALE8["s"] = value


def _make_scaler():
    return lambda g: g * SCALE8["s"]


def _scaled_backward(make):
    class Kept(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.fn = make()
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return ctx.fn(g)
    return Kept


def _changes(**more):
    return dict(between=lambda i: _set_scale(2.0 + i), mid=lambda i: _set_scale(9.0 + i),
                reset=lambda: _set_scale(2.0), **more)


def test_lambda_on_ctx_reads_a_global_when_backward_runs():
    class Kept(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.fn = lambda g: g * SCALE8["s"]
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return ctx.fn(g)

    matches_eager(Kept, lambda i: (x_(i),), **_changes())


def test_inner_def_and_partial_on_ctx():
    class Kept(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            def scale(g, k):
                return g * k * SCALE8["s"]
            ctx.fn = functools.partial(scale, k=2.0)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return ctx.fn(g)

    matches_eager(Kept, lambda i: (x_(i),), **_changes())


def test_lambda_made_by_a_helper_function():
    matches_eager(_scaled_backward(_make_scaler), lambda i: (x_(i),), **_changes())


def test_lambda_captures_an_argument_object():
    cfg = types.SimpleNamespace(s=2.0)

    class Kept(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, c):
            ctx.fn = lambda g: g * c.s
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return ctx.fn(g), None

    matches_eager(Kept, lambda i: (x_(i), cfg), between=lambda i: setattr(cfg, "s", 2.0 + i),
                  mid=lambda i: setattr(cfg, "s", 9.0 + i), reset=lambda: setattr(cfg, "s", 2.0))


def test_comprehension_in_forward_is_no_later_read():
    class Comp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return sum([x * SCALE8["s"] * k for k in (1.0, 2.0)])

        @staticmethod
        def backward(ctx, g):
            return g * 3

    comp = minihop.function(Comp)
    x = x_(0)
    y = comp(x)
    _set_scale(5.0)  # changed before backward: backward does not read it
    try:
        y.sum().backward()
    finally:
        _set_scale(2.0)
    assert torch.equal(x.grad, torch.full((4,), 3.0)) and comp.stats.captures == 1


def test_deferred_lambda_calls_a_helper_and_a_library_binding():
    import torch.nn.functional as F

    original = F.softsign
    helpers = types.ModuleType("round13_helpers")
    exec("K = 2.0\ndef scale():\n    return K * 1.0\n", helpers.__dict__)

    class Kept(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.fn = lambda: helpers.scale() * F.softsign(torch.ones(()))
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * ctx.fn()

    def between(i):
        helpers.K = 2.0 + i

    def mid(i):
        helpers.K = 7.0 + i
        F.softsign = (original, torch.tanh)[i % 2]

    def reset():
        helpers.K = 2.0
        F.softsign = original

    try:
        matches_eager(Kept, lambda i: (x_(i),), between=between, mid=mid, reset=reset)
    finally:
        F.softsign = original


def _helper8(g, k=1.0):
    return g * k * SCALE8["s"]


def test_global_helper_handed_to_ctx_not_called_in_forward():
    class Kept(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.fns = [_helper8, functools.partial(_helper8, k=2.0)]
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return ctx.fns[0](g) + ctx.fns[1](g)

    matches_eager(Kept, lambda i: (x_(i),), **_changes())


def test_helper_called_in_forward_and_handed_to_backward():
    class Kept(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.fn = _helper8
            return _helper8(x)

        @staticmethod
        def backward(ctx, g):
            return ctx.fn(g)

    matches_eager(Kept, lambda i: (x_(i),), **_changes())


def test_helper_only_called_in_forward_adds_no_backward_read():
    class Called(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return _helper8(x)

        @staticmethod
        def backward(ctx, g):
            return g

    report = minihop.explain(Called, x_(0))
    assert not [g for g in report.guards if "SCALE8" in g and "backward" in g], report.guards
    assert [g for g in report.guards if "SCALE8" in g], report.guards


# -- methods that are not functions ---------------------------------------------------------
# ``forward = staticmethod(functools.partial(impl, k=2.0))`` or ``staticmethod(Impl())``: the
# analysis found no code for the method and read nothing of it (a global the function reads,
# the partial's keywords, the object's attributes). Now a partial is its function with the
# parameters it leaves (its args and keywords are read places), a callable object its
# ``__call__`` with ``self`` bound (``roots.methods_of``, ``roots.method_objects``).

def _fwd8(ctx, x, k=1.0):
    return x * k * SCALE8["s"]


def _bwd8(ctx, g, k=1.0):
    return g * k * SCALE8["s"]


def test_methods_that_are_partials():
    class Partial(torch.autograd.Function):
        forward = staticmethod(functools.partial(_fwd8, k=2.0))
        backward = staticmethod(functools.partial(_bwd8, k=2.0))

    matches_eager(Partial, lambda i: (x_(i),), **_changes())


def test_partial_forward_keywords_changed_in_place():
    impl = functools.partial(_fwd8, k=2.0)

    class Partial(torch.autograd.Function):
        forward = staticmethod(impl)

        @staticmethod
        def backward(ctx, g):
            return g * 2

    matches_eager(Partial, lambda i: (x_(i),), between=lambda i: impl.keywords.update(k=2.0 + i),
                  reset=lambda: impl.keywords.update(k=2.0))


def test_methods_that_are_callable_objects():
    class Scale:
        def __init__(self):
            self.k = 2.0

        def __call__(self, ctx, t):
            return t * self.k * SCALE8["s"]

    fwd, bwd = Scale(), Scale()

    class Objects(torch.autograd.Function):
        forward = staticmethod(fwd)
        backward = staticmethod(bwd)

    def between(i):
        fwd.k = 2.0 + i
        _set_scale(2.0 + i)

    def mid(i):
        bwd.k = 5.0 + i
        _set_scale(9.0 + i)

    def reset():
        fwd.k = bwd.k = 2.0
        _set_scale(2.0)

    matches_eager(Objects, lambda i: (x_(i),), between=between, mid=mid, reset=reset)


class _Forwarding:
    """A callable object that forwards to a function it holds (``self.fn(*a)``)."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *a):
        return self.fn(*a)


def test_callable_object_forwarding_to_a_held_function():
    # The function is reached through ``self.fn``: a helper of the bound ``self`` (it was not
    # followed, so its reads were not watched).
    class Forwarded(torch.autograd.Function):
        forward = staticmethod(_Forwarding(_fwd8))
        backward = staticmethod(_Forwarding(_bwd8))

    matches_eager(Forwarded, lambda i: (x_(i),), **_changes())


def test_classmethod_helper_reached_through_cls_is_analysed():
    class Helped(torch.autograd.Function):
        @classmethod
        def _helper(cls, x):
            return x * SCALE8["s"]

        @classmethod
        def forward(cls, ctx, x):
            return cls._helper(x)

        @staticmethod
        def backward(ctx, g):
            return g * 2

    matches_eager(Helped, lambda i: (x_(i),), between=lambda i: _set_scale(2.0 + (i > 1)), reset=lambda: _set_scale(2.0))
    helped = minihop.function(Helped)
    for i in range(3):
        _set_scale(2.0 + (i > 1))
        helped(x_(i))
    _set_scale(2.0)
    assert (helped.stats.captures, helped.stats.hits) == (2, 1)  # (single-use before: 3 captures)


_SEEN8 = {}
_KEPT8 = []  # (alive: an id is never reused within the test)


def _memo_by_id(t):
    _KEPT8.append(t)
    _SEEN8.setdefault(id(t), len(_SEEN8) + 1.0)
    return _SEEN8[id(t)]


def test_callback_takes_the_id_of_a_traced_tensor():
    # Code no analysis reached asks id() of the fake copy (a memo keyed by id): refused, as in
    # analysed code; before, no identity watch ran for it.
    class Memo(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, fns):
            return x * fns[0](x)

        @staticmethod
        def backward(ctx, g):
            return g, None

    held = x_(0).detach().requires_grad_()
    with pytest.raises(minihop.UnsupportedOperationError, match=r"id\(\) of a tensor of the trace"):
        minihop.function(Memo)(held, [_memo_by_id])
    _SEEN8.clear()
    matches_eager(Memo, lambda i: (x_(i), [_memo_by_id]), reset=lambda: (_SEEN8.clear(), _KEPT8.clear()))
    _KEPT8.clear()


# -- ops inside the user's try/except, and refusals the user's code caught -----------------
# ``try: L = torch.linalg.cholesky(a) except RuntimeError: L = eye``: eager's op raises for
# some values and the handler takes another path; a fake tensor never raises there, so the
# capture took the try path on every call and raised where eager recovers (cholesky, inv,
# multinomial, _assert_async). Refused now where the handler may catch torch's errors
# (``tracer/handlers.py``); a ``with`` block, a ``finally`` and ``except KeyError`` catch
# nothing of torch's. And a refusal raised into the user's code that its own ``except``
# caught (``str(x)``, ``vars(x)``) let the trace go on down the handler's path: raised when the
# phase returns.

def _matrices(i):
    good = torch.tensor([[2.0, 0.5], [0.5, 1.0]])
    bad = torch.tensor([[1.0, 2.0], [2.0, 1.0]])  # not positive definite
    return ((good if i % 2 == 0 else bad).clone().requires_grad_(),)


def test_cholesky_in_try_with_a_fallback():
    class Jitter(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            try:
                factor = torch.linalg.cholesky(a)
            except RuntimeError:
                factor = torch.eye(2)
            return factor.sum() * a

        @staticmethod
        def backward(ctx, g):
            return g

    matches_eager(Jitter, _matrices)
    with pytest.raises(minihop.UnsupportedOperationError, match="inside a try whose handler catches except RuntimeError"):
        minihop.capture(Jitter, *_matrices(0))


def test_ops_in_a_helpers_try_and_a_bare_except():
    def safe_inverse(a):
        try:
            return torch.linalg.inv(a)
        except:  # noqa: E722
            return a * 0

    class Inverse(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return safe_inverse(a)

        @staticmethod
        def backward(ctx, g):
            return g

    def singular_or_not(i):
        a = torch.tensor([[1.0, 2.0], [2.0, 4.0]]) if i % 2 else torch.tensor([[1.0, 0.0], [0.0, 2.0]])
        return (a.requires_grad_(),)

    matches_eager(Inverse, singular_or_not)


def test_with_finally_and_safe_handlers_still_capture():
    log, cfg = [], {}

    class Plain(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            try:
                s = cfg["s"]
            except KeyError:
                s = 2.0
            try:
                with torch.enable_grad():
                    y = x * s
            finally:
                log.append(1)
            return y.detach()

        @staticmethod
        def backward(ctx, g):
            return g * 2

    matches_eager(Plain, lambda i: (x_(i),), refusable=False, state=lambda: len(log), reset=log.clear)


def test_refusal_caught_by_the_users_except_is_raised():
    class Caught(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            try:
                text = str(x)
            except Exception:
                text = "?"
            try:
                n = len(vars(x))
            except Exception:
                n = 5
            return x * float(len(text) % 5 + n + 1)

        @staticmethod
        def backward(ctx, g):
            return g

    with pytest.raises(minihop.UnsupportedOperationError, match="text of a tensor"):
        minihop.capture(Caught, x_(0))
    matches_eager(Caught, lambda i: (x_(i),))


class _Swallow:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return True  # swallows the exception


class _PassThrough:
    def __enter__(self):
        return 2.0

    def __exit__(self, *exc):
        return False


def test_with_blocks_whose_manager_may_swallow():
    import contextlib

    class Suppressed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            factor = torch.eye(2)
            with contextlib.suppress(RuntimeError):
                factor = torch.linalg.cholesky(a)
            with _Swallow():
                factor = factor * torch.linalg.cholesky(a).sum()
            return factor.sum() * a

        @staticmethod
        def backward(ctx, g):
            return g

    matches_eager(Suppressed, _matrices)
    with pytest.raises(minihop.UnsupportedOperationError, match="with contextlib.suppress"):
        minihop.capture(Suppressed, *_matrices(0))


def test_with_blocks_that_pass_exceptions_through_still_capture():
    import contextlib
    import threading

    lock = threading.Lock()

    @contextlib.contextmanager
    def tagged():
        yield 2.0

    class Managed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            with lock, torch.no_grad(), _PassThrough() as k, tagged() as s:
                return x * k * s

        @staticmethod
        def backward(ctx, g):
            with torch.autocast("cpu", enabled=False):
                return g * 4

    matches_eager(Managed, lambda i: (x_(i),), refusable=False)


class _Scales(torch.autograd.Function):
    W = torch.full((), 2.0)


def _forward_w(ctx, x):
    return x * _Scales.W


def _backward_w(ctx, g):
    return g * _Scales.W


def test_tensor_class_attribute_read_by_a_backward_that_is_an_object_or_partial():
    # (found by the reads generator at 18abe08: backward as ``_Forwarding(fn)`` or a partial,
    # reading a tensor class attribute rebound before ``.backward()``: the tensor had no route
    # to be fetched when backward runs, so the trace's tensor was used)
    def set_w(value):
        _Scales.W = torch.full((), value)

    class AsObjects(torch.autograd.Function):
        forward = staticmethod(_Forwarding(_forward_w))
        backward = staticmethod(_Forwarding(_backward_w))

    class AsPartials(torch.autograd.Function):
        forward = staticmethod(functools.partial(_forward_w))
        backward = staticmethod(functools.partial(_backward_w))

    for fn_cls in (AsObjects, AsPartials):
        matches_eager(fn_cls, lambda i: (x_(i),), between=lambda i: set_w(2.0 + i),
                      mid=lambda i: set_w(5.0 + i), reset=lambda: set_w(2.0))
