"""torch.cuda's random state in checkpoint-style Functions, against eager (issue 31).

``torch.cuda.get_rng_state`` / ``set_rng_state`` (also as ``fork_rng(devices=[0])`` calls
them) are graph nodes like the CPU generator's (``tracer/recompute.py``). Without CUDA, eager's
get raises (``Torch not compiled with CUDA enabled`` or no driver) and its set is queued for a
CUDA initialisation that never comes; minihop raises the same error and queues the same way.
Each case compares the whole outcome with eager's -- the error (type and message) or the
outputs, every ``.grad`` and the CPU random stream after the calls -- in strict,
``fallback="eager"`` and ``minihop.apply``; so the same tests hold on a machine with a GPU.
The GPU cases (CUDA tensors, dropout masks repeated through the CUDA generator) skip without one.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as Fn
from torch._subclasses.fake_tensor import FakeTensor
from torch.autograd import Function

import minihop

MODES = ("strict", "fallback", "apply")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def _fresh() -> None:
    minihop.reset()


class CudaStateInForward(Function):
    """Megatron's forward: keeps the CPU and the CUDA generator's state."""

    @staticmethod
    def forward(ctx, x):
        ctx.cpu_state = torch.get_rng_state()
        ctx.cuda_state = torch.cuda.get_rng_state()
        return Fn.dropout(x, 0.5)

    @staticmethod
    def backward(ctx, g):
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(ctx.cpu_state)
            torch.cuda.set_rng_state(ctx.cuda_state)
            mask = Fn.dropout(torch.ones_like(g), 0.5)
        return g * mask


class ForkOnDevice0(Function):
    @staticmethod
    def forward(ctx, x):
        with torch.random.fork_rng(devices=[0]):
            return Fn.dropout(x, 0.5)

    @staticmethod
    def backward(ctx, g):
        return g


class CudaSetInBackward(Function):
    """Sets the CUDA generator in backward (without CUDA: queued by torch, no effect)."""

    @staticmethod
    def forward(ctx, x):
        ctx.state = torch.get_rng_state()
        return Fn.dropout(x, 0.5)

    @staticmethod
    def backward(ctx, g):
        if not torch.cuda.is_available():
            torch.cuda.set_rng_state(ctx.state)
        torch.set_rng_state(ctx.state)
        return g * torch.rand_like(g)


class ForkAllDevices(Function):
    """fork_rng() with its default devices (every CUDA device; none here)."""

    @staticmethod
    def forward(ctx, x):
        ctx.state = torch.get_rng_state()
        return Fn.dropout(x, 0.5)

    @staticmethod
    def backward(ctx, g):
        with torch.random.fork_rng():
            torch.set_rng_state(ctx.state)
            return g * Fn.dropout(torch.ones_like(g), 0.5)


def _runner(F: type, mode: str) -> Callable[..., Any]:
    if mode == "strict":
        return minihop.function(F)
    if mode == "fallback":
        return minihop.function(F, fallback="eager")
    return lambda *a: minihop.apply(F, *a)


def _outcome(apply: Callable[..., Any], device: str = "cpu", n: int = 3) -> Any:
    """N calls from one seed: the error, or outputs, grads and the random state after."""
    torch.manual_seed(0)
    if device == "cuda":
        torch.cuda.manual_seed(0)
    results = []
    try:
        for _ in range(n):
            x = torch.randn(8, device=device, requires_grad=True)
            y = apply(x)
            y.sum().backward()
            results.append((y.detach(), x.grad))
    except Exception as e:  # eager's own error, compared below
        return ("error", type(e), str(e).split("\n")[0])
    after = [torch.get_rng_state()] + ([torch.cuda.get_rng_state()] if device == "cuda" else [])
    return ("ok", results, after)


def _assert_same(mine: Any, eager: Any) -> None:
    assert mine[0] == eager[0], (mine, eager)
    if eager[0] == "error":
        assert mine == eager
        return
    for (my, mg), (ey, eg) in zip(mine[1], eager[1], strict=True):
        assert torch.equal(my, ey) and torch.equal(mg, eg)
    for m, e in zip(mine[2], eager[2], strict=True):
        assert torch.equal(m, e), "the random stream after the calls differs"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("F", [CudaStateInForward, ForkOnDevice0, CudaSetInBackward, ForkAllDevices],
                         ids=lambda F: F.__name__)
def test_cpu_tensors_as_eager(F: type, mode: str) -> None:
    """On CPU tensors: eager's error where eager raises (no CUDA), else eager's values, grads
    and random stream. strict captures (no eager call) where eager runs."""
    eager = _outcome(F.apply)
    run = _runner(F, mode)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fallback's "running eagerly" warning, torch's own
        mine = _outcome(run)
    _assert_same(mine, eager)
    if mode == "strict" and eager[0] == "ok":
        assert run.stats.eager_calls == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_set_is_queued_as_eager() -> None:
    """Without CUDA the recorded set runs when the graph runs and torch queues it, as eager's
    call is; tracing queues nothing of its own (no fake tensor is left in torch's queue)."""
    queued = torch.cuda._queued_calls
    before = len(queued)
    run = minihop.function(CudaSetInBackward)
    x = torch.randn(4, requires_grad=True)
    run(x).sum().backward()
    assert run.stats.eager_calls == 0
    assert len(queued) == before + 1  # the graph's call, as eager's one call queues one
    for call, _ in queued:
        for cell in call.__closure__ or ():
            assert not isinstance(cell.cell_contents, FakeTensor)
    x = torch.randn(4, requires_grad=True)
    CudaSetInBackward.apply(x).sum().backward()
    assert len(queued) == before + 2
    del queued[before:]


def test_explain_names_the_cuda_state() -> None:
    """explain() lists the CUDA generator's set as replayed."""
    text = str(minihop.explain(CudaSetInBackward, torch.randn(4, requires_grad=True), print_report=False))
    if not torch.cuda.is_available():
        assert "torch.cuda.set_rng_state(...): replayed" in text


# -- with a GPU -------------------------------------------------------------------------------

class CudaCheckpoint(Function):
    """A checkpoint for CUDA tensors as model-parallel libraries write it: the CUDA state
    saved in forward, restored in backward inside fork_rng, dropout recomputed."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.device = x.device
        ctx.cuda_state = torch.cuda.get_rng_state(x.device)
        ctx.save_for_backward(x, w)
        with torch.no_grad():
            return Fn.dropout(torch.tanh(x @ w), 0.5)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        with torch.random.fork_rng(devices=[ctx.device]):
            torch.cuda.set_rng_state(ctx.cuda_state, ctx.device)
            xd, wd = x.detach().requires_grad_(), w.detach().requires_grad_()
            with torch.enable_grad():
                out = Fn.dropout(torch.tanh(xd @ wd), 0.5)
        torch.autograd.backward(out, g)
        return xd.grad, wd.grad


@needs_cuda
@pytest.mark.parametrize("mode", MODES)
def test_cuda_checkpoint_masks_repeat(mode: str) -> None:
    def outcome(apply: Callable[..., Any]) -> Any:
        torch.manual_seed(0)
        torch.cuda.manual_seed(0)
        results = []
        for _ in range(3):
            x = torch.randn(4, 8, device="cuda", requires_grad=True)
            w = torch.randn(8, 8, device="cuda", requires_grad=True)
            y = apply(x, w)
            y.sum().backward()
            results.append((y.detach(), x.grad, w.grad))
        return results, torch.cuda.get_rng_state()

    eager, eager_state = outcome(CudaCheckpoint.apply)
    run = _runner(CudaCheckpoint, mode)
    mine, mine_state = outcome(run)
    for e, m in zip(eager, mine, strict=True):
        for a, b in zip(e, m, strict=True):
            assert torch.equal(a, b)
    assert torch.equal(mine_state, eager_state)
    if mode == "strict":
        assert run.stats.eager_calls == 0


@needs_cuda
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("F", [CudaStateInForward, ForkOnDevice0], ids=lambda F: F.__name__)
def test_cuda_tensors_as_eager(F: type, mode: str) -> None:
    _assert_same(_outcome(_runner(F, mode), device="cuda"), _outcome(F.apply, device="cuda"))
