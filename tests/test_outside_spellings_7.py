"""Hostile spellings, round 7 (issue #28, round 12): the issue's classes written in ways the
suite had not seen, tried from outside against eager in strict, apply and fallback mode
(``eager_modes.matches_eager``).

Silent differences from eager before this round, in every mode:

- a class attribute that lives on the class's *metaclass* (``class C(metaclass=Meta)``, code
  reads ``C.k``, the caller sets ``Meta.k``): a user class's key held its MRO's dicts, not its
  metaclass's (``guards._class_state`` now keys a user metaclass as a class);
- a tensor argument's attribute first set between forward and ``.backward()``
  (``getattr(w, "tag", 1.0)`` in backward): only tensors carrying attributes at the call were
  watched (``tracer/tensor_attr_reads.py`` now watches every tensor argument);
- ``isinstance(n, int)`` / ``type(n) is int`` on a size or an int argument once automatic
  dynamic made it symbolic (``torch.SymInt``): the other branch was baked in. Code that names
  ``isinstance`` now sees a stand-in answering as eager (``tracer/identity.py``), and reads no
  stand-in can answer (``v.__class__``, ``match n: case int():``, ``(n > 4) is True``, a
  ``singledispatch`` call on a symbolic value, numpy given one: ``np.array([n]).dtype`` is
  ``object``) are refused, so the automatic policy captures such a Function static;
- a traced tensor's text (``str(x)``, ``f"{x}"``, ``repr([x])``) kept as a Python value: the
  fake's ``FakeTensor(...)``; and ``isinstance(x, FakeTensor)``, ``hasattr(x, "fake_mode")``:
  the fake's answers. Now refused (text, fake-only names) or answered as eager's (isinstance);
- the frames of forward's callers (``sys._getframe(1).f_code.co_name``, ``inspect.stack()``):
  minihop's tracer's while traced, eager's ``Function.apply``. Now refused (``tracer/kinds.py``);
- another Function applied by the user's backward (``return STE.apply(g * x)``), run with
  ``create_graph=True``: the double backward differentiated the inner forward's ops where
  eager's calls the inner Function's backward. Now such a backward is traced again with grad
  on, refused where its gradients reach that node (MH104); ``fallback="eager"`` runs the
  user's backward;
- ``log.addHandler(h)`` in forward (eager adds one on every call): a logger's handlers were not
  part of the process settings the heap watch snapshots (``tracer/process_state.py`` now holds
  every logger's handlers and filters with its levels; a change is refused after it is put back).

The rest passed when written and stay as the round's evidence: modules reached through
containers and bound methods, callables built by ``operator``/``types``/``functools``,
generators and iterators consumed, numpy state, aliasing and view properties of arguments, and
state crossed with grad modes, autocast, transforms, checkpointing and dynamic sizes.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import logging
import math
import operator
import types

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import minihop
from eager_modes import matches_eager, normalized, same_normalized


def x_(i):
    return (torch.linspace(-1, 1, 4) + i).requires_grad_()


def crossed(fn_cls, body, steps=4, between=lambda i: None, reset=lambda: None):
    """``body(call, i)`` (it calls and runs backward itself) eagerly, then in strict mode (a
    coded refusal allowed) and fallback mode: the records equal."""
    reset()
    eager = []
    for i in range(steps):
        between(i)
        eager.append(normalized(body(fn_cls.apply, i)))
    for mode, call in {"strict": minihop.function(fn_cls), "fallback": minihop.function(fn_cls, fallback="eager")}.items():
        minihop.reset()
        reset()
        got = []
        for i in range(steps):
            between(i)
            try:
                got.append(normalized(body(call, i)))
            except minihop.MinihopError:
                assert mode == "strict"
                break
        assert same_normalized(tuple(got), tuple(eager[:len(got)])), (mode, got, eager)


# -- the two silent differences ----------------------------------------------------------------

def test_metaclass_attribute_changed_between_calls():
    class Meta(type):
        pass

    class Knobs(metaclass=Meta):
        pass

    Meta.k = 2.0

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, knobs):
            return x * knobs.k

        @staticmethod
        def backward(ctx, g):
            return g, None

    matches_eager(F, lambda i: (x_(i), Knobs), between=lambda i: setattr(Meta, "k", 2.0 + i),
                  reset=lambda: setattr(Meta, "k", 2.0))


def test_metaclass_method_rebound_for_a_global_class():
    class Meta(type):
        def scale(cls):
            return 2.0

    class Knobs(metaclass=Meta):
        pass

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * Knobs.scale()

        @staticmethod
        def backward(ctx, g):
            return g

    original = Meta.scale

    def between(i):
        Meta.scale = original if i % 2 == 0 else (lambda cls: 5.0)

    matches_eager(F, lambda i: (x_(i),), between=between, reset=lambda: setattr(Meta, "scale", original))


def test_tensor_attribute_first_set_before_backward():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(w)
            return x * w

        @staticmethod
        def backward(ctx, g):
            w, = ctx.saved_tensors
            return g * w * getattr(w, "tag", 1.0), None

    ws = [torch.full((4,), 2.0) for _ in range(4)]
    matches_eager(F, lambda i: (x_(i), ws[i]), mid=lambda i: setattr(ws[i], "tag", 3.0 + i) if i % 2 else None,
                  reset=lambda: [w.__dict__.pop("tag", None) for w in ws])


def test_tensor_attribute_first_set_on_an_argument_kept_on_ctx():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.w = w
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * (ctx.w.gain if hasattr(ctx.w, "gain") else 2.0), None

    w = torch.ones(4)
    matches_eager(F, lambda i: (x_(i), w), mid=lambda i: setattr(w, "gain", 5.0 + i) if i >= 2 else None,
                  reset=lambda: w.__dict__.pop("gain", None))


# -- spellings that held: modules, callables, iterators -----------------------------------------

def test_module_in_a_dict_argument_switched_to_eval():
    drop = nn.Dropout(0.5)
    cfg = {"m": drop}

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, cfg):
            return x * (2.0 if cfg["m"].training else 3.0)

        @staticmethod
        def backward(ctx, g):
            return g, None

    matches_eager(F, lambda i: (x_(i), cfg), between=lambda i: drop.train(i % 2 == 0), reset=drop.train)


def test_bound_forward_of_a_module_whose_eps_changes():
    ln = nn.LayerNorm(4, elementwise_affine=False)

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, fn):
            return fn(x)

        @staticmethod
        def backward(ctx, g):
            return g, None

    matches_eager(F, lambda i: (x_(i) * 1e-3, ln.forward), between=lambda i: setattr(ln, "eps", 1e-5 * 10 ** i),
                  reset=lambda: setattr(ln, "eps", 1e-5))


def test_forward_hook_added_between_calls():
    lin = nn.Linear(4, 4)
    handles = []

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, m):
            return m(x)

        @staticmethod
        def backward(ctx, g):
            return g, None

    def between(i):
        if i == 2:
            handles.append(lin.register_forward_hook(lambda m, a, o: o * 10))

    def reset():
        while handles:
            handles.pop().remove()

    try:
        matches_eager(F, lambda i: (x_(i), lin), between=between, reset=reset)
    finally:
        reset()


@pytest.mark.parametrize("make", ["attrgetter", "methodcaller", "MethodType"])
def test_callables_built_by_the_standard_library(make):
    class Obj:
        def __init__(self):
            self.k = 2.0

        def scale(self, m):
            return self.k * m

    obj = Obj()
    fn = {"attrgetter": lambda: (lambda o, g=operator.attrgetter("k"): g(o)),
          "methodcaller": lambda: (lambda o, c=operator.methodcaller("scale", 1.0): c(o)),
          "MethodType": lambda: (lambda o, b=types.MethodType(lambda self: self.k, obj): b())}[make]()

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, fn, o):
            return x * fn(o)

        @staticmethod
        def backward(ctx, g):
            return g, None, None

    matches_eager(F, lambda i: (x_(i), fn, obj), between=lambda i: setattr(obj, "k", 2.0 + i),
                  reset=lambda: setattr(obj, "k", 2.0))


def test_singledispatch_registration_between_calls():
    box = {}

    def fresh():
        @functools.singledispatch
        def scale(v):
            return 2.0
        box["scale"] = scale

    fresh()

    class Tag:
        pass

    tag = Tag()

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, t):
            return x * box["scale"](t)

        @staticmethod
        def backward(ctx, g):
            return g, None

    def between(i):
        if i == 2:
            box["scale"].register(Tag, lambda v: 5.0)

    matches_eager(F, lambda i: (x_(i), tag), between=between, reset=fresh)


def test_cached_property_emptied_between_calls():
    class Cfg:
        def __init__(self):
            self.base = 2.0

        @functools.cached_property
        def k(self):
            return self.base * 2

    cfg = Cfg()

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * cfg.k

        @staticmethod
        def backward(ctx, g):
            return g

    def between(i):
        cfg.base = 2.0 + i
        cfg.__dict__.pop("k", None)

    matches_eager(F, lambda i: (x_(i),), between=between, reset=lambda: between(0))


def test_iterators_consumed_by_forward():
    box = {}

    def fresh():
        def accumulate():
            total = 0.0
            while True:
                total += yield total
        gen = accumulate()
        next(gen)
        box.update(count=itertools.count(1), gen=gen)

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * next(box["count"]) + box["gen"].send(1.0)

        @staticmethod
        def backward(ctx, g):
            return g

    matches_eager(F, lambda i: (x_(i),), reset=fresh)


def test_context_variable_set_between_calls():
    var = contextvars.ContextVar("minihop_round12", default=2.0)

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * var.get()

        @staticmethod
        def backward(ctx, g):
            return g

    matches_eager(F, lambda i: (x_(i),), between=lambda i: var.set(2.0 + i), reset=lambda: var.set(2.0))


# -- numpy, aliasing, views ------------------------------------------------------------------------

def test_numpy_state():
    arr = np.array([2.0])

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, a, s):
            return x * float(a[0]) * float(np.random.rand()) * math.copysign(1.0, s)

        @staticmethod
        def backward(ctx, g):
            return g, None, None

    matches_eager(F, lambda i: (x_(i), arr, np.float64(-0.0 if i % 2 else 0.0)),
                  between=lambda i: arr.__setitem__(0, 2.0 + i),
                  reset=lambda: (arr.__setitem__(0, 2.0), np.random.seed(0)), state=lambda: np.random.get_state()[2])


@pytest.mark.parametrize("read", ["is", "data_ptr", "_base", "storage_offset"])
def test_aliasing_and_view_properties_of_arguments(read):
    base = torch.arange(12.0)

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            if read == "is":
                k = 2.0 if x is y else 3.0
            elif read == "data_ptr":
                k = 2.0 if x.data_ptr() == y.data_ptr() else 3.0
            elif read == "_base":
                k = 2.0 if y._base is not None else 3.0
            else:
                k = float(y.storage_offset() + 1)
            return x * k

        @staticmethod
        def backward(ctx, g):
            return g, None

    def make(i):
        x = x_(i)
        if read == "is":
            return (x, x) if i % 2 else (x, x_(i + 10))
        if read == "_base":
            return (x, base[:4] if i % 2 else base[:4].clone())
        return (x, base[4 * (i % 2):4 * (i % 2) + 4] if read == "data_ptr" else base[i:i + 4])

    matches_eager(F, make)


# -- state crossed with modes, transforms and sizes --------------------------------------------------

STATE = {"k": 2.0}


def _scale(i):
    STATE["k"] = 2.0 + i


def test_global_crossed_with_dynamic_sizes_and_no_grad():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * STATE["k"], x.shape[0] * 2

        @staticmethod
        def backward(ctx, g, _):
            return g * STATE["k"]

    def body(call, i):
        x = torch.linspace(0, 1, 3 + i).requires_grad_()
        if i % 2:
            with torch.no_grad():
                return call(x)
        y, n = call(x)
        y.sum().backward()
        return y.detach(), n, x.grad

    crossed(F, body, steps=6, between=lambda i: _scale(i // 2), reset=lambda: _scale(0))


def test_module_eps_crossed_with_autocast():
    ln = nn.LayerNorm(4)

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return ln(x) @ torch.eye(4)

        @staticmethod
        def backward(ctx, g):
            return g

    def body(call, i):
        x = x_(i).view(1, 4).detach().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=i % 2 == 1):
            y = call(x)
        y.float().sum().backward()
        return y.detach(), y.dtype, x.grad

    crossed(F, body, between=lambda i: setattr(ln, "eps", 10.0 ** -(i + 1)), reset=lambda: setattr(ln, "eps", 1e-5))


def test_global_crossed_with_func_transforms():
    class F(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x):
            return x.sin() * STATE["k"]

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return g * x.cos() * STATE["k"]

    def body(call, i):
        t = torch.arange(8.0).view(2, 4) + i
        return torch.func.vmap(call)(t), torch.func.grad(lambda v: call(v).sum())(t[0])

    crossed(F, body, between=_scale, reset=lambda: _scale(0))


def test_global_changed_before_a_checkpoint_recomputes():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * STATE["k"]

        @staticmethod
        def backward(ctx, g):
            return g * STATE["k"]

    def body(call, i):
        x = x_(i)
        y = checkpoint(lambda t: call(t).sin(), x, use_reentrant=False)
        _scale(3 + i)  # eager's recompute in backward reads this
        y.sum().backward()
        return y.detach(), x.grad

    crossed(F, body, reset=lambda: _scale(0))


def test_inner_function_crossed_with_double_backward():
    class Cube(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return g * 3 * x ** 2

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return Cube.apply(x) * STATE["k"]

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return g * 3 * x ** 2 * STATE["k"]

    def body(call, i):
        x = x_(i)
        y = call(x)
        gx, = torch.autograd.grad(y.sum(), x, create_graph=True)
        gx.sum().backward()
        return y.detach(), gx.detach(), x.grad

    crossed(F, body, between=_scale, reset=lambda: _scale(0))


def test_output_structure_chosen_by_globals():
    flags = {"n": 2, "nd": False}

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            outs = tuple(x * (j + 1) for j in range(flags["n"]))
            if flags["nd"]:
                ctx.mark_non_differentiable(outs[-1])
            return outs

        @staticmethod
        def backward(ctx, *grads):
            return sum(g * (j + 1) for j, g in enumerate(grads) if g is not None)

    def body(call, i):
        x = x_(i)
        ys = call(x)
        sum(y.sum() for y in ys if y.requires_grad).backward()
        return tuple(y.detach() for y in ys), tuple(y.requires_grad for y in ys), x.grad

    def between(i):
        flags.update(n=2 + i % 2, nd=i >= 2)

    crossed(F, body, between=between, reset=lambda: flags.update(n=2, nd=False))


def test_tensor_attribute_read_by_backward_under_a_transform():
    # (Under torch.func the capture's backward had no call arguments to read ``w.k`` from:
    # an IndexError inside minihop, in every mode.)
    class F(torch.autograd.Function):
        @staticmethod
        def forward(x, w):
            return x.sin() * w

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(*inputs)

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            return g * x.cos() * w * getattr(w, "k", 1.0), None

    w = torch.full((4,), 2.0)
    w.k = 3.0

    def body(call, i):
        return torch.func.grad(lambda v: call(v, w).sum())(torch.arange(4.0) + i)

    crossed(F, body, between=lambda i: setattr(w, "k", 3.0 + i), reset=lambda: setattr(w, "k", 3.0))


@pytest.mark.parametrize("change", ["addHandler", "removeHandler", "addFilter", "handler level"])
def test_logger_handlers_changed_by_forward(change):
    log = logging.getLogger("minihop.tests.round12")
    kept = logging.NullHandler()

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            if change == "addHandler":
                log.addHandler(logging.NullHandler())
            elif change == "removeHandler":
                log.removeHandler(log.handlers[-1]) if log.handlers else None
            elif change == "addFilter":
                log.addFilter(logging.Filter("nothing"))
            else:
                kept.setLevel(kept.level + 1)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    def reset():
        log.handlers[:] = [kept, logging.NullHandler(), logging.NullHandler()]
        log.filters.clear()
        kept.setLevel(0)

    try:
        matches_eager(F, lambda i: (x_(i),), reset=reset,
                      state=lambda: (len(log.handlers), len(log.filters), kept.level))
    finally:
        log.handlers.clear()
        log.filters.clear()


class CodedError(Exception):
    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


def test_user_exception_after_a_write_and_a_context_manager():
    log = []

    class Timer:
        def __init__(self):
            self.n = 0
            self.active = False

        def __enter__(self):
            self.n += 1
            self.active = True

        def __exit__(self, *exc):
            self.active = False
            return False

    timer = Timer()

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, i):
            log.append(i)
            with timer:
                if i % 2:
                    raise CodedError(f"odd {i}", code=10 * i)
                return x * (2.0 if timer.active else 3.0)

        @staticmethod
        def backward(ctx, g):
            return g * 2, None

    def run(call):
        log.clear()
        timer.n = 0
        out = []
        for i in range(4):
            x = x_(i)
            try:
                y = call(x, i)
                y.sum().backward()
                out.append((y.detach().tolist(), x.grad.tolist()))
            except CodedError as e:
                out.append((type(e).__name__, str(e), e.code))
            out.append((list(log), timer.n, timer.active))
        return out

    eager = run(F.apply)
    for call in (minihop.function(F), minihop.function(F, fallback="eager")):
        minihop.reset()
        try:
            assert run(call) == eager
        except minihop.MinihopError:
            assert call.fallback != "eager"


# -- symbolic numbers read for their class; inner Functions under create_graph ------------------

@functools.singledispatch
def _scale_of(v):
    return 3.0


@_scale_of.register
def _(v: int):
    return 2.0


@pytest.mark.parametrize("read", ["isinstance", "type", "isinstance_tuple", "class_attr", "match", "singledispatch",
                                  "is_true"])
def test_a_size_read_for_its_class_under_automatic_dynamic(read):
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            n = x.shape[0]
            if read == "isinstance":
                k = 2.0 if isinstance(n, int) else 3.0
            elif read == "type":
                k = 2.0 if type(n) is int else 3.0
            elif read == "isinstance_tuple":
                k = 2.0 if all(isinstance(d, (int, float)) for d in x.shape) else 3.0
            elif read == "class_attr":
                k = 2.0 if n.__class__ is int else 3.0
            elif read == "is_true":
                k = 2.0 if (n > 4) is True else 3.0
            elif read == "match":
                match n:
                    case int():
                        k = 2.0
                    case _:
                        k = 3.0
            else:
                k = _scale_of(n)
            return x * k

        @staticmethod
        def backward(ctx, g):
            return g

    matches_eager(F, lambda i: (torch.linspace(-1, 1, 3 + i).requires_grad_(),), steps=5)


def test_an_int_argument_read_for_its_class_under_automatic_dynamic():
    def pick(k):
        return 2.0 if isinstance(k, int) else 3.0

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k):
            return x * pick(k) * k

        @staticmethod
        def backward(ctx, g):
            return g, None

    matches_eager(F, lambda i: (x_(i), [2, 2.0, 3, 3.0, 4, 5][i]), steps=6)


def test_a_tensor_read_for_its_class():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * (2.0 if x.__class__ is torch.Tensor else 3.0)

        @staticmethod
        def backward(ctx, g):
            return g

    matches_eager(F, lambda i: (x_(i),))


class _RoundSTE(torch.autograd.Function):
    # A straight-through estimator: its backward is not its forward's derivative (round's is 0).
    @staticmethod
    def forward(ctx, g):
        return g.round()

    @staticmethod
    def backward(ctx, gg):
        return gg * STATE["k"]


@pytest.mark.parametrize("create_graph", [False, True])
def test_inner_function_applied_by_backward(create_graph):
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return _RoundSTE.apply(g * x)

    def body(call, i):
        x = x_(i)
        seed = torch.full((4,), 1.3, requires_grad=True)
        gx, = torch.autograd.grad(call(x), x, seed, create_graph=create_graph)
        if not create_graph:
            return gx
        _scale(5 + i)  # read by the inner backward, in the double backward
        return gx.detach(), torch.autograd.grad(gx.sum(), (seed, x))

    crossed(F, body, between=_scale, reset=lambda: _scale(0))


@pytest.mark.parametrize("read", ["str", "repr", "fstring", "format", "list_repr", "isinstance_fake", "hasattr_fake",
                                  "getattr_fake"])
def test_a_tensor_read_for_its_text_or_kind(read):
    from torch._subclasses.fake_tensor import FakeTensor

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            if read == "str":
                seen = str(x)
            elif read == "repr":
                seen = repr(x)
            elif read == "fstring":
                seen = f"x = {x}"
            elif read == "format":
                seen = "{}".format(x)
            elif read == "list_repr":
                seen = str([x])
            elif read == "isinstance_fake":
                seen = isinstance(x, FakeTensor)
            elif read == "hasattr_fake":
                seen = hasattr(x, "fake_mode")
            else:
                seen = getattr(x, "fake_device", None) is None
            return x * 2, seen

        @staticmethod
        def backward(ctx, g, _):
            return g * 2

    matches_eager(F, lambda i: (x_(i),), steps=3)


def test_a_tensor_sent_as_a_message_keeps_its_values():
    # (print and logging's lazy arguments are replayed with each call's tensors: not refused)
    import io
    import contextlib

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            print("x is", x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        matches_eager(F, lambda i: (x_(i),), steps=3, reset=lambda: (out.seek(0), out.truncate()),
                      state=lambda: out.getvalue())


class _ProjectionGrad(torch.autograd.Function):
    # Written as torch-struct's sparsemax semiring writes its gradient step: forward returns the
    # saved projection itself (no op), backward applies the projection's Jacobian.
    @staticmethod
    def forward(ctx, w_star, dim):
        ctx.save_for_backward(w_star, dim)
        return w_star

    @staticmethod
    def backward(ctx, grad_output):
        w_star, dim = ctx.saved_tensors
        support = (w_star > 0).to(grad_output.dtype)
        centred = grad_output - (grad_output * support).sum(int(dim.item()), keepdim=True) / support.sum(
            int(dim.item()), keepdim=True)
        return centred * support, None


class _SoftProject(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, dim):
        w_star = torch.softmax(scores * 4.0, dim)  # (a stand-in projection, positive everywhere)
        ctx.save_for_backward(scores, w_star.clone(), torch.tensor(dim))
        return scores.mul(w_star).sum(dim)

    @staticmethod
    def backward(ctx, grad_output):
        scores, w_star, dim = ctx.saved_tensors
        w_star.requires_grad_(True)
        grad_input = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output.unsqueeze(int(dim.item())).mul(_ProjectionGrad.apply(w_star, dim))
        return grad_input, None


@pytest.mark.parametrize("create_graph", [False, True])
def test_a_semiring_backward_applying_its_gradient_function(create_graph):
    # Captured for an ordinary backward; under create_graph strict mode refuses (the gradient
    # step's node is reached, though only through the leaf backward made of its saved value:
    # over-refused, never guessed) and fallback mode matches eager.
    def body(call, i):
        scores = (torch.linspace(-1, 1, 12).view(3, 4) + i).requires_grad_()
        out = call(scores, -1)
        seed = torch.linspace(0.5, 1.5, 3, requires_grad=True)
        gx, = torch.autograd.grad(out, scores, seed, create_graph=create_graph)
        if not create_graph:
            return out.detach(), gx
        return out.detach(), gx.detach(), torch.autograd.grad((gx * gx).sum(), (seed, scores), allow_unused=True)

    crossed(_SoftProject, body, steps=2)


_REFERENCED = object()


@pytest.mark.parametrize("read", ["getframe", "inspect_stack", "f_back", "getrefcount"])
def test_forward_reading_its_callers_frames(read):
    import inspect
    import sys

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            if read == "getframe":
                caller = sys._getframe(1).f_code.co_name
            elif read == "inspect_stack":
                caller = inspect.stack()[1].function
            elif read == "f_back":
                caller = inspect.currentframe().f_back.f_code.co_name
            else:  # (the trace holds references of its own)
                caller = "apply" if sys.getrefcount(_REFERENCED) % 2 else "other"
            return x * (2.0 if caller == "apply" else 3.0), caller

        @staticmethod
        def backward(ctx, g, _):
            return g

    matches_eager(F, lambda i: (x_(i),), steps=2)


def test_numpy_given_a_size_under_automatic_dynamic():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k):
            return x * 2, str(np.array([x.shape[0], k]).dtype), int(np.sum([x.shape[0], k]))

        @staticmethod
        def backward(ctx, g, *_):
            return g * 2, None

    matches_eager(F, lambda i: (torch.linspace(-1, 1, 3 + i).requires_grad_(), 2 + i), steps=5)


class _Bisect(torch.autograd.Function):
    # Written as entmax's bisection Functions are: classmethods all through, a helper reached
    # as ``cls._power``, ``isinstance(alpha, torch.Tensor)``, a loop; called with sizes that
    # change (automatic dynamic shapes). Tracing it once left minihop's isinstance stand-in in
    # this module's globals (a kept copy of a dict put back after the stand-in was removed):
    # conftest.py now fails any test that leaves one.
    @classmethod
    def _power(cls, x, alpha):
        return x ** (alpha - 1)

    @classmethod
    def forward(cls, ctx, X, alpha=1.5, dim=-1, n_iter=8):
        if not isinstance(alpha, torch.Tensor):
            alpha = torch.tensor(alpha, dtype=X.dtype)
        ctx.dim = dim
        # (a float made from a size reaches an op: the symbolic trace is refused, then static)
        lo = X.max(dim=dim, keepdim=True)[0] - cls._power(1 / X.shape[dim], alpha)
        step = torch.ones_like(lo) / X.shape[dim]
        for _ in range(n_iter):
            step = step / 2
            lo = torch.where(((X - lo - step).clamp(min=0).sum(dim, keepdim=True) >= 1), lo + step, lo)
        p = (X - lo).clamp(min=0)
        ctx.save_for_backward(p)
        return p

    @classmethod
    def backward(cls, ctx, dY):
        (p,) = ctx.saved_tensors
        support = (p > 0).to(dY.dtype)
        dX = dY * support
        return dX - support * dX.sum(ctx.dim, keepdim=True) / support.sum(ctx.dim, keepdim=True), None, None, None


def test_a_bisection_function_with_classmethods_under_automatic_dynamic():
    matches_eager(_Bisect, lambda i: ((torch.linspace(-1, 1, 2 * (4 + i)).reshape(2, 4 + i) * (1 + i)).requires_grad_(),
                                      1.5, -1, 8), steps=4)
    assert "isinstance" not in globals() and "type" not in globals()


def test_a_refused_trace_leaves_the_stand_ins_working():
    # (A refused trace put back what code it did not analyse may have written, and kept
    # minihop's own frames' state too: the stand-ins' table was emptied, and every later
    # trace answered isinstance of a symbolic size as torch.SymInt. In this order, in one test.)
    test_numpy_state()
    minihop.reset()
    test_an_int_argument_read_for_its_class_under_automatic_dynamic()
