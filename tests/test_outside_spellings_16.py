"""Hostile spellings, round 16 (issue #28, round 21): what torch itself answers from outside a
Function's arguments, and tensors with code of their own, tried from outside against eager in
strict, apply and fallback mode (``eager_modes.matches_eager``).

Differences from eager before this round:

- torch's functions of process and device state whose names do not say "get" or "is"
  (``torch.backends.cuda.flash_sdp_enabled()``, ``math_sdp_enabled()``,
  ``preferred_linalg_library()``): torch was bounded whole, so a capture baked the answer in and
  reused it after ``torch.backends.cuda.enable_flash_sdp(False)``, in every mode. The functions of
  torch's process modules (``library.TORCH_PROCESS``) answer from settings: unknown now, so the
  capture is single-use, unless ``settings`` names the call as a getter it guards;
- ``torch.overrides.has_torch_function((x,))`` answered True while minihop traced (its recorder
  is a torch function mode; eager: False), and ``isinstance(x, FakeTensor)`` likewise. What
  tells whether torch's modes are on or a tensor is fake is refused now (MH104), as is
  ``sys.gettrace()`` (minihop's code watch) and torch.func's probes (``is_batchedtensor(x)``:
  a capture is traced outside transforms);
- a tensor subclass with a ``__torch_function__`` of the user's, passed in (also in a list, or
  as a module's parameter) or read from a global: minihop's key, guards and snapshots read its
  shape and dtype (and the heap watch pickled it), running that code dozens of times per call,
  in fallback mode too. Refused now (MH101) before anything is read of it, so fallback runs
  eager, whose code runs it exactly as often as eager does.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop
from minihop.errors import UnsupportedArgumentError, UnsupportedOperationError

from eager_modes import matches_eager


def _x(i: int, n: int = 4) -> torch.Tensor:
    return (torch.linspace(-1.0, 1.0, n) + i).requires_grad_()


def _reads(read: Any) -> type:
    class Reads(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * (5.0 if read() else 2.0)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * (3.0 if read() else 1.0)
    return Reads


@pytest.mark.parametrize("flag", ["flash", "math", "mem_efficient"])
def test_sdp_backend_flag_read_between_calls(flag: str) -> None:
    """forward and backward read ``torch.backends.cuda.<flag>_sdp_enabled()`` (torch's own getters
    of a process setting, named without "get"); the caller toggles it between calls."""
    read = getattr(torch.backends.cuda, f"{flag}_sdp_enabled")
    enable = getattr(torch.backends.cuda, f"enable_{flag}_sdp")
    was = read()
    try:
        matches_eager(_reads(read), lambda i: (_x(i),), between=lambda i: enable(i % 2 == 1),
                      reset=lambda: enable(True))
    finally:
        enable(was)


def test_sdp_flag_toggled_before_backward() -> None:
    """The flag toggled between forward and ``.backward()``: backward's read is eager's."""
    was = torch.backends.cuda.flash_sdp_enabled()
    try:
        matches_eager(_reads(torch.backends.cuda.flash_sdp_enabled), lambda i: (_x(i),),
                      mid=lambda i: torch.backends.cuda.enable_flash_sdp(i % 2 == 0),
                      reset=lambda: torch.backends.cuda.enable_flash_sdp(True))
    finally:
        torch.backends.cuda.enable_flash_sdp(was)


def test_preferred_linalg_library_read() -> None:
    """``torch.backends.cuda.preferred_linalg_library()`` with no argument: a getter by use, not
    by name; what it answers is part of the value."""
    class Lib(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * float(len(str(torch.backends.cuda.preferred_linalg_library())))

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g
    matches_eager(Lib, lambda i: (_x(i),))


def test_torch_process_call_is_single_use() -> None:
    """A capture that calls one of torch's process functions no guard names serves its own call
    only; ``explain`` says which call made it so."""
    f = minihop.function(_reads(torch.backends.cuda.flash_sdp_enabled))
    f(_x(0)).sum().backward()
    f(_x(1)).sum().backward()
    assert f.stats.captures == 2, f.stats
    text = str(minihop.explain(_reads(torch.backends.cuda.flash_sdp_enabled), _x(0)))
    assert "flash_sdp_enabled" in text and "settings no key holds" in text, text


def _mode_probe(probe: Any) -> type:
    class Probe(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * (5.0 if probe(x) else 2.0)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * 2.0
    return Probe


_PROBES = {
    "has_torch_function": lambda x: torch.overrides.has_torch_function((x,)),
    "has_torch_function_unary": lambda x: torch.overrides.has_torch_function_unary(x),
    "function_mode_enabled": lambda x: torch._C._is_torch_function_mode_enabled(),
    "dispatch_mode": lambda x: torch.utils._python_dispatch._get_current_dispatch_mode() is not None,
    "is_fake": lambda x: torch._subclasses.fake_tensor.is_fake(x),
    "isinstance_fake": lambda x: isinstance(x, torch._subclasses.FakeTensor),
    # the interpreter's tracer: minihop's code watch while it traces (a getter by name, so it was
    # guarded by the answer minihop's own check got: None, against the trace's)
    "gettrace": lambda x: sys.gettrace() is not None,
}


def _probes_transform(probe: Any) -> type:
    class ProbesTransform(Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x: torch.Tensor) -> torch.Tensor:
            return x * (5.0 if probe(x) else 2.0)

        @staticmethod
        def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
            pass

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * 2.0
    return ProbesTransform


_TRANSFORM_PROBES = {
    "is_batchedtensor": lambda x: torch._C._functorch.is_batchedtensor(x),
    "is_functorch_wrapped_tensor": lambda x: torch._C._functorch.is_functorch_wrapped_tensor(x),
    "transforms_active": lambda x: torch._C._are_functorch_transforms_active(),
    "maybe_get_level": lambda x: torch._C._functorch.maybe_get_level(x) >= 0,
}


@pytest.mark.parametrize("transform", ["none", "vmap", "grad"])
@pytest.mark.parametrize("probe", sorted(_TRANSFORM_PROBES))
def test_transform_probe(probe: str, transform: str) -> None:
    """forward asks torch.func whether a transform is on, or its tensor is wrapped (under
    ``torch.vmap`` eager's is a BatchedTensor): a capture, traced outside the transform, answered
    False under vmap, silently. Refused (MH104); fallback equals eager under every transform."""
    fn_cls = _probes_transform(_TRANSFORM_PROBES[probe])

    def run(call: Any) -> tuple[torch.Tensor, ...]:
        x = torch.linspace(-1.0, 1.0, 6).reshape(2, 3).requires_grad_()
        if transform == "grad":
            return (torch.func.grad(lambda t: call(t).sum())(x.detach()),)
        y = torch.vmap(call)(x) if transform == "vmap" else call(x)
        y.sum().backward()
        return y.detach(), x.grad
    eager = run(fn_cls.apply)
    minihop.reset()
    torch.testing.assert_close(run(minihop.function(fn_cls, fallback="eager")), eager, rtol=0, atol=0)
    with pytest.raises(UnsupportedOperationError, match="torch._C._"):
        run(minihop.function(fn_cls))


@pytest.mark.parametrize("probe", sorted(_PROBES))
def test_trace_machinery_probe(probe: str) -> None:
    """forward asks whether torch's modes are on or its tensor is fake: while minihop traces
    they are; eager's answer is no. Refused (MH104) where the capture would differ; fallback
    equals eager."""
    fn_cls = _mode_probe(_PROBES[probe])
    matches_eager(fn_cls, lambda i: (_x(i),))
    with pytest.raises(UnsupportedOperationError, match="transform are on, or a tensor is fake or wrapped"):
        minihop.function(fn_cls)(_x(0))


class Logged(torch.Tensor):
    """A tensor subclass that notes each torch call made on it (a profiler's, a debugger's)."""
    LOG: list[str] = []

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        Logged.LOG.append(getattr(func, "__name__", "?"))
        return super().__torch_function__(func, types, args, kwargs or {})


def _logged(n: int = 4) -> torch.Tensor:
    return torch.ones(n).as_subclass(Logged)


class Scale(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2


class ScaleByItem(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, ts: list[torch.Tensor]) -> torch.Tensor:
        return x * ts[0]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g * 2, None


_W = _logged()


class ScaleByGlobal(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * _W

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2


class ScaleInBackward(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2 + g * _W.as_subclass(torch.Tensor).sum()


class RunModule(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, m: torch.nn.Module) -> torch.Tensor:
        return m(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g, None


def _module_with_logged_weight() -> torch.nn.Module:
    inner = torch.nn.Linear(4, 4)
    inner.weight = torch.nn.Parameter(inner.weight.detach().as_subclass(Logged))
    return torch.nn.Sequential(inner)


_LOGGED_CASES = {
    "argument": (Scale, lambda i: (_x(i).detach().as_subclass(Logged).requires_grad_(),)),
    "in a list argument": (ScaleByItem, lambda i: (_x(i), [_logged()])),
    "a global": (ScaleByGlobal, lambda i: (_x(i),)),
    "a global's method, in backward": (ScaleInBackward, lambda i: (_x(i),)),
    "a module's parameter": (RunModule, (lambda m: lambda i: (_x(i), m))(_module_with_logged_weight())),
}


@pytest.mark.parametrize("where", sorted(_LOGGED_CASES))
def test_tensor_subclass_with_own_torch_function(where: str) -> None:
    """A tensor subclass whose ``__torch_function__`` notes every call: its log after each call
    and each backward is eager's in every mode (minihop reads nothing of it; refused, MH101)."""
    fn_cls, make_args = _LOGGED_CASES[where]
    matches_eager(fn_cls, make_args, reset=Logged.LOG.clear, state=lambda: list(Logged.LOG))
    with pytest.raises(UnsupportedArgumentError, match=r"a Logged \(a tensor subclass\) with code of its own"):
        minihop.function(fn_cls)(*make_args(0))


def test_plain_subclass_still_keyed() -> None:
    """A subclass with no code of its own (``torch._C._disabled_torch_function_impl``, or none)
    is not refused for that: what it answers is torch's (a guard)."""
    class Quiet(torch.Tensor):
        __torch_function__ = torch._C._disabled_torch_function_impl
    matches_eager(Scale, lambda i: (_x(i).detach().as_subclass(Quiet).requires_grad_(),))


# -- memos keyed by a tuple (torchgpipe's and fairscale's phonies) ------------------------------

_PHONIES: dict[Any, torch.Tensor] = {}


def _get_phony(device: torch.device, *, requires_grad: bool) -> torch.Tensor:
    key = (device, requires_grad)
    try:
        phony = _PHONIES[key]
    except KeyError:
        phony = torch.zeros(1, device=device, requires_grad=requires_grad)
        _PHONIES[key] = phony
    return phony


class Fork(Function):
    @staticmethod
    def forward(ctx: Any, input: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        phony = _get_phony(input.device, requires_grad=False)
        return input.detach(), phony.detach()

    @staticmethod
    def backward(ctx: Any, grad_input: torch.Tensor, grad_grad: torch.Tensor) -> torch.Tensor:
        return grad_input


def _memo_state(memo: dict[Any, torch.Tensor]) -> list[tuple[str, list[float]]]:
    return sorted((str(k), v.tolist()) for k, v in memo.items())


def test_phony_memo_keyed_by_device_and_flag() -> None:
    """A memo of tensors keyed by ``(device, requires_grad)`` that forward fills on a miss (a
    pipeline's "phony"): captured (the key names the place again; it was refused as a key
    minihop cannot name), and the memo holds what eager's does after each call."""
    matches_eager(Fork, lambda i: (_x(i),), reset=_PHONIES.clear, state=lambda: _memo_state(_PHONIES),
                  refusable=False)


_TABLES: dict[Any, torch.Tensor] = {}


class ByDtypeAndSize(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        key = (x.dtype, x.shape[0])
        if key not in _TABLES:
            _TABLES[key] = torch.arange(x.shape[0], dtype=x.dtype)
        return x * _TABLES[key]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * _TABLES[(g.dtype, g.shape[0])]


def _alternating_dtype(i: int) -> tuple[torch.Tensor]:
    return (_x(i) if i % 2 else _x(i).double().detach().requires_grad_(),)


def test_memo_keyed_by_dtype_and_size() -> None:
    """A table per ``(dtype, size)``, float32 and float64 calls alternating: captured, each call
    reads its own dtype's table, and the memo is eager's."""
    matches_eager(ByDtypeAndSize, _alternating_dtype, reset=_TABLES.clear, state=lambda: _memo_state(_TABLES),
                  refusable=False)


def test_memo_keyed_by_tuple_written_and_cleared_by_caller() -> None:
    """The caller writes the tables in place between calls and before ``.backward()``, and clears
    the memo (backward then raises eager's ``KeyError``)."""
    def write(i: int) -> None:
        for table in _TABLES.values():
            table.add_(1.0)
    matches_eager(ByDtypeAndSize, lambda i: (_x(i),), between=write, mid=write, reset=_TABLES.clear,
                  state=lambda: _memo_state(_TABLES))
    matches_eager(ByDtypeAndSize, lambda i: (_x(i),), between=lambda i: _TABLES.clear() if i == 2 else None,
                  mid=lambda i: _TABLES.clear() if i == 1 else None, reset=_TABLES.clear,
                  state=lambda: _memo_state(_TABLES))


_NAN_KEYED: dict[Any, torch.Tensor] = {}


class NanKeyed(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        _NAN_KEYED[(float("nan"), 1)] = x.detach() * 2
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2


def test_float_keyed_memo_still_refused() -> None:
    """A key with a float (NaN never equals itself: each eager call adds an entry of its own) is
    not named again: refused, and fallback's memo grows as eager's."""
    matches_eager(NanKeyed, lambda i: (_x(i),), reset=_NAN_KEYED.clear, state=lambda: len(_NAN_KEYED))
    with pytest.raises(minihop.MinihopError, match="below a key minihop cannot name again"):
        minihop.function(NanKeyed)(_x(0))


# -- what a tensor argument answers that its key does not hold --------------------------------


def _layout_alternating(i: int) -> tuple[torch.Tensor]:
    t = torch.linspace(-1.0, 1.0, 120).reshape(2, 3, 4, 5).add(i)
    return ((t.to(memory_format=torch.channels_last) if i % 2 else t).requires_grad_(),)


def test_dim_order_of_argument_between_layouts() -> None:
    """forward scales by ``x.dim_order()`` (how the argument lies in memory); contiguous and
    channels-last calls alternate. ``dim_order`` was listed as an answer the key holds, so the
    contiguous call's capture served the channels-last one (x * 2 where eager gives x * 3)."""
    class ByOrder(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * float(x.dim_order()[1] + 1)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * 2.0
    matches_eager(ByOrder, _layout_alternating, refusable=False)


def test_zerotensor_argument_flag() -> None:
    """forward branches on ``x._is_zerotensor()`` (autograd's efficient zeros); zero tensors and
    plain zeros alternate. A fake copy has no such flag (its answer was False, on that very call,
    in every mode): refused as the autograd state of an argument (MH104); fallback is eager."""
    class ByZero(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x + (2.0 if x._is_zerotensor() else 3.0)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g
    matches_eager(ByZero, lambda i: (torch._efficientzerotensor(4) if i % 2 else torch.zeros(4),))
    with pytest.raises(UnsupportedOperationError, match="_is_zerotensor"):
        minihop.function(ByZero)(torch.zeros(4))


# -- a model holding a minihop function, copied and pickled ------------------------------------


class Twice(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2


@minihop.captured(fallback="eager")
class CapturedTwice(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2


class Holder(torch.nn.Module):
    """A layer keeping its op as an attribute (``self.act = F.apply``), as packages write it."""

    def __init__(self, op: Any) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(self.lin(x))


_OPS = {
    "eager": lambda: Twice.apply,
    "function": lambda: minihop.function(Twice),
    "fallback": lambda: minihop.function(Twice, fallback="eager"),
    "dynamic": lambda: minihop.function(Twice, dynamic=True, cache_limit=3),
    "captured": lambda: CapturedTwice.apply,
}


def _copied(model: torch.nn.Module, how: str) -> torch.nn.Module:
    import copy
    import pickle
    return copy.deepcopy(model) if how == "deepcopy" else pickle.loads(pickle.dumps(model))


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
@pytest.mark.parametrize("op", sorted(_OPS))
def test_model_holding_minihop_function_is_copied(op: str, how: str) -> None:
    """``copy.deepcopy(model)`` (an EMA, a teacher) and pickling a model whose layer holds a
    minihop function: it raised TypeError (a lock) and AttributeError (a local function) where
    eager's ``F.apply`` copies by reference. Now the copy runs as eager's does, with the same
    policy (values and every ``.grad``)."""
    def run(model: torch.nn.Module) -> list[torch.Tensor]:
        x = torch.linspace(-1.0, 1.0, 6).reshape(2, 3).requires_grad_()
        y = model(x)
        y.sum().backward()
        return [y.detach(), x.grad, model.lin.weight.grad]
    torch.manual_seed(0)
    eager = Holder(Twice.apply)
    torch.manual_seed(0)
    mine = Holder(_OPS[op]())
    run(eager), run(mine)
    eager_copy, mine_copy = _copied(eager, how), _copied(mine, how)
    for a, b in zip(run(mine_copy), run(eager_copy)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    held = mine_copy.op.__self__ if hasattr(mine_copy.op, "__self__") else mine_copy.op
    if op in ("function", "fallback", "dynamic"):
        assert (held.fallback, held.dynamic, held.cache_limit) == (mine.op.fallback, mine.op.dynamic, mine.op.cache_limit)
        assert (held is mine.op) == (how == "deepcopy")  # (a copy shares it, as a function is shared)


# -- what backward asks its grad that a fake grad does not reproduce ---------------------------


def _asks_grad(read: Any) -> type:
    class AsksGrad(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * read(g)
    return AsksGrad


def _losses(call: Any, steps: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Plain and concatenated losses alternate: the grad of ``y`` is then a slice of the cat's
    grad (a view, at storage offset 6), else a tensor of its own."""
    out = []
    for i in range(steps):
        x = (torch.linspace(-1.0, 1.0, 6).reshape(2, 3) + i).requires_grad_()
        y = call(x)
        if i % 2:
            loss = (torch.cat([torch.zeros(2, 3), y]) * torch.arange(12.0).reshape(4, 3)).sum()
        else:
            loss = (y * 3).sum()
        loss.backward()
        out.append((y.detach(), x.grad))
    return out


@pytest.mark.parametrize("read", ["_is_view", "storage_offset", "is_contiguous"])
def test_backward_asks_grad_what_a_fake_grad_lacks(read: str) -> None:
    """backward asks its grad ``g._is_view()`` or ``g.storage_offset()`` (a slice of a cat's grad
    on every other call). A backward traced again for those grads asked a fake grad made with
    the grad's strides only (not a view, offset 0) and served its answer, silently, in strict
    mode. Now such a variant is refused (MH104) and fallback runs eager's backward for the call;
    ``is_contiguous`` (which strides answer) stays captured."""
    answers = {"_is_view": lambda g: 5.0 if g._is_view() else 2.0,
               "storage_offset": lambda g: float(g.storage_offset() + 1),
               "is_contiguous": lambda g: 5.0 if g.is_contiguous() else 2.0}
    fn_cls = _asks_grad(answers[read])
    eager = _losses(fn_cls.apply)
    for fallback in ("raise", "eager"):
        minihop.reset()
        try:
            got = _losses(minihop.function(fn_cls, fallback=fallback))
        except UnsupportedOperationError as e:
            assert fallback == "raise" and read != "is_contiguous", e
            assert f"grad {read}()" in str(e), e
            continue
        assert len(got) == len(eager)
        for (y, g), (ey, eg) in zip(got, eager):
            torch.testing.assert_close((y, g), (ey, eg), rtol=0, atol=0)


@pytest.mark.parametrize("op", ["gelu", "linear", "erf", "norm", "rfft"])
def test_torch_ops_of_c_namespaces_stay_reusable(op: str) -> None:
    """torch's ops whose builtins live in ``torch._C``'s op namespaces (``torch._C._nn.gelu``,
    ``_linalg``, ``_special``, ``_fft``) answer from their arguments: one capture serves every
    call (only ``torch._C``'s own functions are process state)."""
    ops = {"gelu": lambda x: torch.nn.functional.gelu(x), "linear": lambda x: torch.nn.functional.linear(x, x),
           "erf": lambda x: torch.special.erf(x), "norm": lambda x: torch.linalg.norm(x) * x,
           "rfft": lambda x: torch.fft.rfft(x).real.sum() * x}
    body = ops[op]

    class Op(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return body(x)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g
    f = minihop.function(Op)
    for i in range(3):
        x = torch.linspace(-1.0, 1.0, 4).add(i).reshape(2, 2)
        torch.testing.assert_close(f(x), Op.apply(x), rtol=0, atol=0)
    assert f.stats.captures == 1, f.stats


# -- what ctx is, asked by the user's code -----------------------------------------------------


def _asks_ctx(fwd: Any = None, bwd: Any = None) -> type:
    class AsksCtx(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            ctx.k = 1
            return x * (fwd(ctx) if fwd else 2.0)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * (bwd(ctx) if bwd else 2.0)
    return AsksCtx


_CTX_QUESTIONS = {
    "type name": lambda c: float(len(type(c).__name__)),
    "__class__ name": lambda c: float(len(c.__class__.__name__)),
    "isinstance FunctionCtx": lambda c: 5.0 if isinstance(c, torch.autograd.function.FunctionCtx) else 2.0,
    "isinstance BackwardCFunction": lambda c: 5.0 if isinstance(c, torch.autograd.function.BackwardCFunction) else 2.0,
    "vars": lambda c: float(len(vars(c))),
    "__dict__": lambda c: float(len(c.__dict__)),
    "repr": lambda c: 5.0 if "Backward object" in repr(c) else 2.0,
    "hasattr to_save": lambda c: 5.0 if hasattr(c, "to_save") else 2.0,
    "getattr dirty_tensors": lambda c: 5.0 if getattr(c, "dirty_tensors", 1) is None else 2.0,
    "dir": lambda c: float(len(dir(c)) % 5),
    "_forward_cls": lambda c: float(len(c._forward_cls.__name__)),
}


@pytest.mark.parametrize("phase", ["forward", "backward"])
@pytest.mark.parametrize("question", sorted(_CTX_QUESTIONS))
def test_what_ctx_is(question: str, phase: str) -> None:
    """forward or backward asks ctx what it is: ``type(ctx).__name__`` (eager: ``AsksCtxBackward``),
    ``isinstance(ctx, FunctionCtx)``, ``vars(ctx)`` (the user's attributes), its text, whether it
    has autograd's ``to_save``. minihop's proxy ctx answered with its own class, dict and text,
    silently in strict mode; now it answers as eager's (class, text, a dict of the user's
    attributes), or refuses (``dir``, autograd's own attributes: MH104)."""
    ask = _CTX_QUESTIONS[question]
    fn_cls = _asks_ctx(fwd=ask) if phase == "forward" else _asks_ctx(bwd=ask)
    matches_eager(fn_cls, lambda i: (_x(i),))


def test_ctx_class_answered_without_refusal() -> None:
    """What eager's ctx is (its class, ``isinstance``, text) is answered, not refused: one capture
    serves every call. (``vars(...)`` of anything makes a capture single-use: reads.md.)"""
    fn_cls = _asks_ctx(fwd=lambda c: float(len(type(c).__name__) + len(repr(c).split()[0]))
                       + (1.0 if isinstance(c, torch.autograd.function.FunctionCtx) else 0.0))
    matches_eager(fn_cls, lambda i: (_x(i),), refusable=False)
    f = minihop.function(fn_cls)
    for i in range(3):
        f(_x(i))
    assert f.stats.captures == 1, f.stats


class AsksCtxClass(Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        ctx.name_len = len(type(ctx).__name__)
        ctx.is_ctx = isinstance(ctx, torch.autograd.function.FunctionCtx)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * ctx.name_len + (1.0 if ctx.is_ctx else 0.0)


@pytest.mark.parametrize("transform", ["none", "vmap", "grad"])
def test_what_ctx_is_under_transforms(transform: str) -> None:
    """Under ``torch.vmap`` eager's ``setup_context`` gets functorch's wrapper ctx
    (``CtxCustomSave``: not a ``FunctionCtx``), under ``torch.func.grad`` a generated
    ``...GeneratedBackward``; a capture (traced outside the transform) that asked what ctx is runs
    the user's Function there, as a custom ``vmap`` rule does."""
    def run(call: Any) -> tuple[torch.Tensor, ...]:
        x = torch.linspace(-1.0, 1.0, 6).reshape(2, 3).requires_grad_()
        if transform == "grad":
            return (torch.func.grad(lambda t: call(t).sum())(x.detach()),)
        y = torch.vmap(call)(x) if transform == "vmap" else call(x)
        y.sum().backward()
        return y.detach(), x.grad
    eager = run(AsksCtxClass.apply)
    for fallback in ("raise", "eager"):
        minihop.reset()
        torch.testing.assert_close(run(minihop.function(AsksCtxClass, fallback=fallback)), eager, rtol=0, atol=0)


class _Phase(__import__("enum").IntEnum):
    TRAIN = 1


_BY_PHASE: dict[Any, torch.Tensor] = {}


class ByPhase(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        if (_Phase.TRAIN, "w") not in _BY_PHASE:
            _BY_PHASE[(_Phase.TRAIN, "w")] = torch.arange(4.0)
        return x * _BY_PHASE[(_Phase.TRAIN, "w")]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * _BY_PHASE[(_Phase.TRAIN, "w")]


def test_memo_keyed_by_an_int_enum_stays_captured() -> None:
    """A memo keyed by an ``IntEnum`` member (alone, or in a tuple) is named again as before the
    round (a subclass of int); the tuple rule's first cut took ``type(k) in (int, ...)`` and
    refused it (a guard: passes on 1f51872)."""
    matches_eager(ByPhase, lambda i: (_x(i),), reset=_BY_PHASE.clear, state=lambda: _memo_state(_BY_PHASE),
                  refusable=False)
