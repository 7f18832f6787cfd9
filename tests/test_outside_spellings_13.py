"""Hostile spellings, round 13 (issue #28, round 18): code that runs when an object dies, tried
from outside against eager in strict, apply and fallback mode (``eager_modes.matches_eager``).

Differences from eager before this round, with no error:

- ``weakref.ref(t, callback)`` on a tensor forward makes (a local): eager clears forward's
  locals as it returns and the tensor dies first, running the callback on every call; the
  trace's tensor is a fake its graph keeps, so the callback never ran, in any mode
  (``fallback="eager"`` included: nothing refused). A weak reference with a callback of the
  user's among a returning frame's locals is refused now (MH106, ``tracer.death_code``);
- ``ctx.n = Noisy()`` with a ``__del__`` of the user's (directly, or inside a list or dict on
  ctx): eager runs it when each call's graph is freed, a capture's ctx object lives as long as
  the capture. Refused; and under ``fallback="eager"`` the refused trace's own object ran its
  ``__del__`` after minihop had put the caller's state back (an extra write per capture):
  forward's ctx is emptied while the watches run now;
- an object with a ``__del__`` that forward returns (the capture keeps the trace's as the
  template of what it returns) or a weak reference with a callback to a tensor the trace
  made, kept where it outlives the call (a global list): refused;
- a refused trace that had stored such an object in a global list (``REG.append(Noisy())``):
  minihop put the list back after its watches had stopped, so the object's ``__del__`` wrote
  ``DEAD.append(...)`` for good; fallback's first call differed from eager's. The trace's
  state is put back once while the watches still run now (``pystate.StateTracker.abort``).

- a backward that makes an object whose ``__del__`` appends to a list held by a global object
  (``LOG.lines.append``): backward is traced once while forward's call is captured and again
  when ``.backward()`` runs, and what unanalysed code wrote while traced is put back, but the
  watch kept only the global object's own attributes, not the list inside it: one extra line
  per call. The watch keeps what the code names two levels down now
  (``call_watch.CallWatch._keep_value``);
- ``next(ITERATORS[name])`` with ``name`` an argument: the chain ends at the dict (the key is
  known only as the code runs), so the iterator in it was not refused before the trace, which
  took a value from it that no refusal could give back (fallback's first call differed). An
  iterator inside a container a chain ends at is refused before the trace now
  (``iterators.refuse_iterator_read``).

- a write into a library module's own namespace: ``sys.k = getattr(sys, "k", 0) + 1``,
  ``torch.nn.functional.k += 1`` (in forward or backward, by the module's name or an alias of
  it), ``setattr(torch.nn.functional, "k", ...)``, or an item put in a dict subclass a library
  module holds (torch's ``_global_forward_hooks``, an ``OrderedDict``): made once, while
  traced, and never again (chains through a library module were neither guarded nor watched,
  and only its plain ``list``/``dict``/``set`` containers were). A library module's namespace
  the code writes or hands to a call is watched now (its names, by identity:
  ``heap.LIBRARY_MODULE``), and any change there is refused: its reads are not guarded, so no
  write could be replayed;

- ``np.seterr(all="ignore")`` in forward, the caller setting ``"warn"`` again between calls:
  numpy's error handling is a process setting no snapshot held (numpy's functions are bounded
  as pure), so the trace set it once. numpy's error handling, print options and buffer size are
  process settings now (``process_state``): a change is refused and put back;

- ``getattr(P, "lr_scale", 1.0)`` on a global ``nn.Parameter`` (a per-parameter setting kept
  as a Python attribute of the tensor), ``hasattr(P, ...)``, the same of ``PARAMS[0]`` or of a
  global module's ``weight``, and ``getattr(P, name, 1.0)`` with a name chosen at run time:
  baked in, since only an argument's key holds a tensor's attributes (a lifted tensor's guard
  is on its shape, dtype, device and grad). A tensor a chain names outside the arguments has
  its attributes as one read place now (``tensor_attr_reads.attributes_place``), a
  constant-name ``getattr`` with a default is a chain (``opaque.constant_getattrs``), and a
  run-time name on a tensor the trace did not make makes the capture single-use;

- a Function applied with grad on inside backward whose ctx keeps such an object: refused
  (``grad_modes.watching_applies`` asks the node of what it returns); a failed trace now also
  lets go of the values its graphs keep (``GraphRecorder.let_go``) and of the refusals its
  phases noted, while its watches run, so the refused trace's object never runs its code
  after minihop put the caller's state back;

What is not refused: an object the caller made (a global kept on ctx), and a weak reference
whose callback is a library's own bookkeeping (a ``WeakKeyDictionary`` keyed by the input).
The other cases are new spellings of the issue's classes that already matched eager and stay
here as cases the suite had not seen: ``functools.cached_property`` on an argument and on a
global, a generator and ``itertools`` iterators as state, ``torch.amp.custom_fwd``/
``custom_bwd`` with and without autocast, ``once_differentiable`` under a double backward,
hooks on ``y.grad_fn``, ``saved_tensors_hooks`` and non-reentrant checkpoint around the call.
"""

from __future__ import annotations

import collections
import functools
import gc
import itertools
import sys
import weakref

import pytest
import torch
import torch.nn.functional as TF
from torch.autograd.function import once_differentiable

import minihop

from eager_modes import caller, matches_eager


def x_(i):
    return (torch.linspace(-1, 1, 4) + i).requires_grad_()


class Log:
    """What the user's death code wrote, read after a full collection."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def reset(self) -> None:
        gc.collect()
        self.lines.clear()

    def state(self) -> list[str]:
        gc.collect()
        return list(self.lines)


# -- weak references with callbacks of the user's --------------------------------------------

WEAK_LOG = Log()


class WeakCallbackOnLocal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        t = x * 3
        r = weakref.ref(t, lambda ref: WEAK_LOG.lines.append("t"))  # noqa: F841 - the point
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_weakref_callback_on_a_local_tensor():
    matches_eager(WeakCallbackOnLocal, lambda i: (x_(i),), reset=WEAK_LOG.reset, state=WEAK_LOG.state)


def test_weakref_callback_refusal_names_the_callback():
    with pytest.raises(minihop.MinihopError, match=r"MH106.*a local of its frame is a weak reference whose callback"):
        minihop.function(WeakCallbackOnLocal)(x_(0))


REFS: list = []


class WeakCallbackOnInputKept(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        REFS.append(weakref.ref(x, lambda ref: WEAK_LOG.lines.append("x")))
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_weakref_callback_on_the_input_kept_globally():
    def reset():
        REFS.clear()
        WEAK_LOG.reset()
    matches_eager(WeakCallbackOnInputKept, lambda i: (x_(i),), reset=reset, state=WEAK_LOG.state)


class WeakCallbackToCtxObject(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        class Box:
            pass
        b = Box()
        ctx.b = b
        ctx.refs = [weakref.ref(b, lambda ref: WEAK_LOG.lines.append("box"))]
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_weakref_callback_to_an_object_on_ctx():
    matches_eager(WeakCallbackToCtxObject, lambda i: (x_(i),), reset=WEAK_LOG.reset, state=WEAK_LOG.state)


class LibraryCallback(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        seen = weakref.WeakKeyDictionary()
        seen[x] = 1
        ctx.k = len(seen)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k * 2


def test_a_library_callback_is_captured():
    matches_eager(LibraryCallback, lambda i: (x_(i),), refusable=False)


# -- __del__ of the user's --------------------------------------------------------------------

DEL_LOG = Log()


class Noisy:
    def __init__(self, v: float = 1.0) -> None:
        self.v = v

    def __del__(self, lines: list = DEL_LOG.lines) -> None:  # (bound: still there at exit)
        lines.append("del")


class DelOnCtx(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.n = Noisy()
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class DelNestedOnCtx(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.items = [1, {"n": Noisy()}]
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class DelSetByBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        ctx.n = Noisy()
        return g * 2


class DelReturned(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2, Noisy()

    @staticmethod
    def backward(ctx, g, _):
        return g * 2


class DelLocal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        n = Noisy()
        return x * n.v

    @staticmethod
    def backward(ctx, g):
        n = Noisy(2.0)
        return g * n.v


@pytest.mark.parametrize("fn", [DelOnCtx, DelNestedOnCtx, DelSetByBackward, DelLocal],
                         ids=lambda f: f.__name__)
def test_del_of_an_object_the_call_makes(fn):
    matches_eager(fn, lambda i: (x_(i),), reset=DEL_LOG.reset, state=DEL_LOG.state)


def test_del_of_a_returned_object():
    """Eager returns a new object each call, which dies when the caller drops it; the capture
    would keep the trace's as its template (dying when the capture does): refused. Fallback's
    values and the number of ``__del__`` runs are eager's."""
    with pytest.raises(minihop.MinihopError, match=r"MH106.*it returns an object with a __del__"):
        minihop.function(DelReturned)(x_(0))
    for mode in ("eager", "fallback"):
        minihop.reset()
        DEL_LOG.reset()
        call = caller(mode, DelReturned)
        counts = []
        for i in range(3):
            x = x_(i)
            y, n = call(x)
            assert type(n) is Noisy and torch.equal(y, x.detach() * 2)
            y.sum().backward()
            del y, n
            counts.append(len(DEL_LOG.state()))
        assert counts == [1, 2, 3], (mode, counts)


REG: list = []


class DelStoredGlobally(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        REG.append(Noisy())
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_del_of_an_object_stored_globally():
    def between(i):
        if i == 2:
            REG.clear()

    def reset():
        REG.clear()
        DEL_LOG.reset()
    matches_eager(DelStoredGlobally, lambda i: (x_(i),), between=between, reset=reset,
                  state=lambda: (DEL_LOG.state(), len(REG)))


class DelStoredByBackward(torch.autograd.Function):
    """Refused when the trace's writes are classified, after the watches stopped: the frames of
    that refusal held the trace's object past the put-back, so its ``__del__`` wrote for good
    and fallback's backward read one line too many (found by the effects generator)."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        REG.append(Noisy())
        return g * float(len(DEL_LOG.lines) % 3 + 1)


def test_del_of_an_object_backward_stores_globally():
    def reset():
        REG.clear()
        DEL_LOG.reset()
    matches_eager(DelStoredByBackward, lambda i: (x_(i),), reset=reset, state=lambda: (DEL_LOG.state(), len(REG)))


class InnerKeepsDying(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.n = Noisy()
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class AppliesInnerInBackward(torch.autograd.Function):
    """Backward applies another Function with grad on: eager's inner node (its ctx, keeping
    the object) dies with what backward made; the trace's graph holds only the inner ops."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            InnerKeepsDying.apply(x.detach().requires_grad_())
        return g * 2


class AppliesInnerInForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return InnerKeepsDying.apply(x) + 1

    @staticmethod
    def backward(ctx, g):
        return g * 2


@pytest.mark.parametrize("fn", [AppliesInnerInBackward, AppliesInnerInForward], ids=lambda f: f.__name__)
def test_del_of_an_object_an_inner_functions_ctx_keeps(fn):
    matches_eager(fn, lambda i: (x_(i),), reset=DEL_LOG.reset, state=DEL_LOG.state)


GLOBAL_NOISY = Noisy(3.0)


class CallersObjectOnCtx(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.n = GLOBAL_NOISY
        return x * ctx.n.v

    @staticmethod
    def backward(ctx, g):
        return g * ctx.n.v


def test_an_object_the_caller_made_is_captured():
    matches_eager(CallersObjectOnCtx, lambda i: (x_(i),), reset=DEL_LOG.reset, state=DEL_LOG.state,
                  refusable=False)


# -- new spellings that match eager ------------------------------------------------------------

class Settings:
    def __init__(self, s):
        self.s = s
        self.calls = 0

    @functools.cached_property
    def scale(self):
        self.calls += 1
        return self.s * 2.0


SETTINGS = Settings(1.5)


class CachedPropertyArgument(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cfg):
        ctx.k = cfg.scale
        return x * cfg.scale

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k, None


def test_cached_property_of_an_argument():
    def between(i):
        if i == 2:
            SETTINGS.__dict__.pop("scale", None)
            SETTINGS.s = 3.0

    def reset():
        SETTINGS.__dict__.pop("scale", None)
        SETTINGS.s, SETTINGS.calls = 1.5, 0
    matches_eager(CachedPropertyArgument, lambda i: (x_(i), SETTINGS), between=between, reset=reset,
                  state=lambda: (SETTINGS.calls, SETTINGS.__dict__.get("scale")))


class Tables:
    def __init__(self):
        self.n = 0

    @functools.cached_property
    def table(self):
        self.n += 1
        return torch.arange(4.0) * self.n


TABLES = Tables()


class CachedPropertyGlobal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x + TABLES.table

    @staticmethod
    def backward(ctx, g):
        return g


def test_cached_property_of_a_global():
    def between(i):
        if i == 2:
            TABLES.__dict__.pop("table", None)

    def reset():
        TABLES.__dict__.pop("table", None)
        TABLES.n = 0
    matches_eager(CachedPropertyGlobal, lambda i: (x_(i),), between=between, reset=reset, state=lambda: TABLES.n)


ITERATORS: dict = {}


def _steps():
    k = 0
    while True:
        k += 1
        yield k * 0.5


class NextOfGlobal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, which):
        return x * next(ITERATORS[which])

    @staticmethod
    def backward(ctx, g):
        return g, None


@pytest.mark.parametrize("which", ["count", "cycle", "generator", "map"])
def test_next_of_an_iterator_kept_globally(which):
    def reset():
        ITERATORS.update(count=itertools.count(1), cycle=itertools.cycle([1.0, 2.0, 3.0]),
                         generator=_steps(), map=map(float, range(1, 100)))
    matches_eager(NextOfGlobal, lambda i: (x_(i), which), reset=reset)


class GeneratorArgument(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, it):
        return x * next(it)

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_a_generator_passed_in():
    made = [_steps()]
    matches_eager(GeneratorArgument, lambda i: (x_(i), made[0]), reset=lambda: made.__setitem__(0, _steps()))


class AmpLinear(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w.t(), x.t() @ g


class AmpLinearCast(AmpLinear):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w


@pytest.mark.parametrize("fn", [AmpLinear, AmpLinearCast], ids=lambda f: f.__name__)
def test_custom_fwd_with_and_without_autocast(fn):
    w = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), requires_grad=True)
    entered = []

    def between(i):
        if entered:
            entered.pop().__exit__(None, None, None)
        if i in (1, 3):
            region = torch.autocast("cpu", dtype=torch.bfloat16)
            region.__enter__()
            entered.append(region)

    def reset():
        w.grad = None
        while entered:
            entered.pop().__exit__(None, None, None)
    try:
        matches_eager(fn, lambda i: ((torch.randn(2, 4) + i).requires_grad_(), w), between=between,
                      reset=reset, steps=5)
    finally:
        reset()


class OnceDifferentiable(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.exp()

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.exp()


def test_once_differentiable_backward_twice():
    matches_eager(OnceDifferentiable, lambda i: (x_(i),), backwards=2)


class SinMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x.sin() * y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * x.cos() * y, g * x.sin()


def _every_mode(body):
    found = {}
    for mode in ("eager", "strict", "apply", "fallback"):
        minihop.reset()
        torch.manual_seed(0)
        found[mode] = body(caller(mode, SinMul))
    for mode in ("strict", "apply", "fallback"):
        assert repr(found[mode]) == repr(found["eager"]), (mode, found[mode], found["eager"])


def test_hooks_on_the_outputs_grad_fn():
    def body(call):
        seen = []
        for i in range(3):
            x, y = x_(i), x_(i + 1)
            out = call(x, y)
            out.grad_fn.register_prehook(lambda go: seen.append(("pre", len(go))))
            out.grad_fn.register_hook(lambda gi, go: seen.append(
                ("post", [None if t is None else tuple(t.shape) for t in gi], len(go))))
            out.sum().backward()
            seen.append((x.grad.sum().item(), y.grad.sum().item()))
        return seen
    _every_mode(body)


def test_saved_tensors_hooks_around_the_call():
    def body(call):
        seen = collections.Counter()

        def pack(t):
            seen["pack"] += 1
            return t * 1

        def unpack(t):
            seen["unpack"] += 1
            return t
        grads = []
        for i in range(3):
            x, y = x_(i), x_(i + 1)
            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                out = call(x, y)
            out.sum().backward()
            grads.append(x.grad.sum().item())
        return dict(seen), grads
    _every_mode(body)


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_around_the_call(reentrant):
    def body(call):
        grads = []
        for i in range(3):
            x, y = x_(i), x_(i + 1)
            out = torch.utils.checkpoint.checkpoint(lambda a, b: call(a, b) * 2, x, y, use_reentrant=reentrant)
            out.sum().backward()
            grads.append((x.grad.sum().item(), y.grad.sum().item()))
        return grads
    _every_mode(body)


# -- a library module's own state -------------------------------------------------------------

class SysStore(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        sys.minihop_r18_store = getattr(sys, "minihop_r18_store", 0) + 1
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class TorchIncrement(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        torch.nn.functional.minihop_r18_count += 1
        return x * 2

    @staticmethod
    def backward(ctx, g):
        torch.nn.functional.minihop_r18_count += 10
        return g * 2


class AliasIncrement(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        TF.minihop_r18_count += 1
        return x * TF.minihop_r18_count

    @staticmethod
    def backward(ctx, g):
        return g * 2


class SetattrOnModule(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        setattr(torch.nn.functional, "minihop_r18_count", getattr(torch.nn.functional, "minihop_r18_count", 0) + 1)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class HookTableItem(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        table = torch.nn.modules.module._global_forward_hooks
        torch.nn.modules.module._global_forward_hooks[10_000 + len(table)] = None
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def _library_state():
    hooks = torch.nn.modules.module._global_forward_hooks
    return (getattr(sys, "minihop_r18_store", None), getattr(torch.nn.functional, "minihop_r18_count", None),
            sorted(k for k in hooks if type(k) is int and k >= 10_000))


def _library_reset(count):
    def reset():
        sys.__dict__.pop("minihop_r18_store", None)
        torch.nn.functional.__dict__.pop("minihop_r18_count", None)
        if count is not None:
            torch.nn.functional.minihop_r18_count = count
        hooks = torch.nn.modules.module._global_forward_hooks
        for k in [k for k in hooks if type(k) is int and k >= 10_000]:
            del hooks[k]
    return reset


@pytest.mark.parametrize("fn, count", [(SysStore, None), (TorchIncrement, 0), (AliasIncrement, 0),
                                       (SetattrOnModule, None), (HookTableItem, None)],
                         ids=lambda v: getattr(v, "__name__", str(v)))
def test_a_write_into_a_library_modules_state(fn, count):
    reset = _library_reset(count)
    try:
        matches_eager(fn, lambda i: (x_(i),), reset=reset, state=_library_state)
    finally:
        _library_reset(None)()


class NumpyErrors(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        import numpy as np
        np.seterr(all="ignore")
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_numpy_error_handling_set_in_forward():
    np = pytest.importorskip("numpy")
    before = np.geterr()
    try:
        matches_eager(NumpyErrors, lambda i: (x_(i),), between=lambda i: np.seterr(all="warn"),
                      reset=lambda: np.seterr(all="warn"), state=lambda: np.geterr()["divide"])
    finally:
        np.seterr(**before)


# -- a Python attribute of a global tensor -------------------------------------------------------

PARAM = torch.nn.Parameter(torch.ones(4))
PARAM_NAME = ["lr_scale"]


class ParamSettingConstant(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.k = getattr(PARAM, "lr_scale", 1.0)
        return x * ctx.k

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k


class ParamSettingComputed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * getattr(PARAM, PARAM_NAME[0], 1.0)

    @staticmethod
    def backward(ctx, g):
        return g


PARAMS = [PARAM]
LAYER = torch.nn.Linear(4, 4)


class ParamSettingHasattr(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * (3.0 if hasattr(PARAM, "lr_scale") else 1.0)

    @staticmethod
    def backward(ctx, g):
        return g


class ParamSettingInList(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * getattr(PARAMS[0], "lr_scale", 1.0)

    @staticmethod
    def backward(ctx, g):
        return g


class WeightSetting(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * getattr(LAYER.weight, "lr_scale", 1.0)

    @staticmethod
    def backward(ctx, g):
        return g


@pytest.mark.parametrize("fn", [ParamSettingConstant, ParamSettingComputed, ParamSettingHasattr, ParamSettingInList,
                                WeightSetting], ids=lambda f: f.__name__)
def test_a_python_attribute_of_a_global_parameter(fn):
    def between(i):
        if i == 2:
            PARAM.lr_scale = LAYER.weight.lr_scale = 3.0

    def reset():
        PARAM.__dict__.pop("lr_scale", None)
        LAYER.weight.__dict__.pop("lr_scale", None)
    try:
        matches_eager(fn, lambda i: (x_(i),), between=between, reset=reset, refusable=False)
    finally:
        reset()
