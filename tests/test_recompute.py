"""Checkpoint-style backwards against eager: recomputation, ``backward()`` inside backward, and
torch's random state saved in forward and put back in backward.

The Functions are written the way their libraries write them: ``torch.utils.checkpoint``'s
reentrant ``CheckpointFunction`` (a ``run_function`` argument, ``preserve_rng_state``,
``fork_rng`` + ``set_rng_state``, ``detach().requires_grad_()``, ``torch.autograd.backward``,
the inputs' ``.grad``), a reversible block (RevNet: backward rebuilds the inputs from the
outputs), and a model-parallel library's checkpoint with its own random-state tracker
(Megatron/fairscale/deepspeed: a tracker object holding states by name).

Each runs N calls from the same seed eagerly and through minihop (strict, and
``fallback="eager"``) and compares every output, every ``.grad`` and the global random stream
after the calls bit for bit: dropout inside the recomputation must draw eager's masks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as Fn
from torch.autograd import Function

import minihop


# -- torch.utils.checkpoint's reentrant variant, as torch writes it ---------------------------

def detach_variable(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    out = []
    for inp in inputs:
        if not isinstance(inp, torch.Tensor):
            out.append(inp)
            continue
        x = inp.detach()
        x.requires_grad = inp.requires_grad
        out.append(x)
    return tuple(out)


class CheckpointFunction(Function):
    @staticmethod
    def forward(ctx, run_function, preserve_rng_state, *args):
        ctx.run_function = run_function
        ctx.preserve_rng_state = preserve_rng_state
        if preserve_rng_state:
            ctx.fwd_cpu_state = torch.get_rng_state()
        ctx.save_for_backward(*args)
        with torch.no_grad():
            outputs = run_function(*args)
        return outputs

    @staticmethod
    def backward(ctx, *args):
        inputs = ctx.saved_tensors
        rng_devices: list[int] = []
        with torch.random.fork_rng(devices=rng_devices, enabled=ctx.preserve_rng_state):
            if ctx.preserve_rng_state:
                torch.set_rng_state(ctx.fwd_cpu_state)
            detached_inputs = detach_variable(tuple(inputs))
            with torch.enable_grad():
                outputs = ctx.run_function(*detached_inputs)
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        outputs_with_grad = []
        args_with_grad = []
        for i in range(len(outputs)):
            if torch.is_tensor(outputs[i]) and outputs[i].requires_grad:
                outputs_with_grad.append(outputs[i])
                args_with_grad.append(args[i])
        if len(outputs_with_grad) == 0:
            raise RuntimeError("none of output has requires_grad=True, this checkpoint() is not necessary")
        torch.autograd.backward(outputs_with_grad, args_with_grad)
        grads = tuple(inp.grad if isinstance(inp, torch.Tensor) else None for inp in detached_inputs)
        return (None, None) + grads


def mlp_block(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    h = Fn.dropout(torch.tanh(x @ w1), 0.5, training=True)
    return Fn.dropout(h @ w2, 0.2, training=True) + x


def two_outputs(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = Fn.dropout(x @ w1, 0.3, training=True)
    return torch.sigmoid(h), (h @ w2).relu()


# -- a reversible block (RevNet), weights as arguments ---------------------------------------

def _f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return Fn.dropout(torch.tanh(x @ w), 0.25, training=True)


class RevBlockFunction(Function):
    """y1 = x1 + f(x2); y2 = x2 + g(y1), f and g with dropout. Forward keeps only the
    outputs and the random state before each of f and g (as reformer's ``Deterministic``
    does); backward rebuilds x2 from y1, y2 and back-propagates through g, then f,
    recomputed under the state each drew from."""

    @staticmethod
    def forward(ctx, x1, x2, wf, wg):
        ctx.f_state = torch.get_rng_state()
        y1 = x1 + _f(x2, wf)
        ctx.g_state = torch.get_rng_state()
        y2 = x2 + _f(y1, wg)
        ctx.save_for_backward(y1, y2, wf, wg)
        return y1, y2

    @staticmethod
    def backward(ctx, dy1, dy2):
        y1, y2, wf, wg = ctx.saved_tensors
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(ctx.g_state)
            with torch.enable_grad():
                y1_ = y1.detach().requires_grad_()
                wg_ = wg.detach().requires_grad_()
                gy1 = _f(y1_, wg_)
                torch.autograd.backward(gy1, dy2)
            with torch.no_grad():
                x2 = y2 - gy1
                dx1 = dy1 + y1_.grad
            torch.set_rng_state(ctx.f_state)
            with torch.enable_grad():
                x2_ = x2.detach().requires_grad_()
                wf_ = wf.detach().requires_grad_()
                fx2 = _f(x2_, wf_)
                fx2.backward(dx1)
            with torch.no_grad():
                dx2 = dy2 + x2_.grad
        return dx1, dx2, wf_.grad, wg_.grad


# -- a model-parallel library's checkpoint with a random-state tracker ----------------------

class RngStatesTracker:
    """Named CPU random states, as Megatron's ``CudaRNGStatesTracker`` keeps CUDA ones."""

    def __init__(self) -> None:
        self.states: dict[str, torch.Tensor] = {}

    def add(self, name: str, seed: int) -> None:
        orig = torch.get_rng_state()
        torch.manual_seed(seed)
        self.states[name] = torch.get_rng_state()
        torch.set_rng_state(orig)

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng"):
        orig = torch.get_rng_state()
        torch.set_rng_state(self.states[name])
        try:
            yield
        finally:
            self.states[name] = torch.get_rng_state()
            torch.set_rng_state(orig)


class TrackedCheckpointFunction(Function):
    """Megatron/deepspeed's ``CheckpointFunction``: saves the global state and the tracker's
    states in forward, restores both in backward, recomputes, backward()s."""

    @staticmethod
    def forward(ctx, run_function, tracker, *args):
        ctx.run_function = run_function
        ctx.tracker = tracker
        ctx.fwd_cpu_rng_state = torch.get_rng_state()
        ctx.fwd_tracker_state = tracker.states["model-parallel-rng"]
        with torch.no_grad():
            outputs = run_function(*args)
        ctx.save_for_backward(*args)
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        inputs = detach_variable(ctx.saved_tensors)
        bwd_cpu_rng_state = torch.get_rng_state()
        bwd_tracker_state = ctx.tracker.states["model-parallel-rng"]
        torch.set_rng_state(ctx.fwd_cpu_rng_state)
        ctx.tracker.states["model-parallel-rng"] = ctx.fwd_tracker_state
        with torch.enable_grad():
            outputs = ctx.run_function(*inputs)
        torch.set_rng_state(bwd_cpu_rng_state)
        ctx.tracker.states["model-parallel-rng"] = bwd_tracker_state
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        torch.autograd.backward(outputs, grads)
        return (None, None) + tuple(inp.grad for inp in inputs)


def tracked_block(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = Fn.dropout(x @ w, 0.5, training=True)  # the global stream: data-parallel dropout
    return Fn.dropout(torch.tanh(h), 0.5, training=True)


# -- running N calls against eager ---------------------------------------------------------------

Apply = Callable[..., Any]


def _calls(apply: Apply, make: Callable[[], tuple[Any, ...]], n: int, seed: int) -> tuple[list[Any], torch.Tensor]:
    """N calls from one seed: each call's outputs and the .grad of every tensor argument, and
    the global random state after all of them."""
    torch.manual_seed(seed)
    results = []
    for i in range(n):
        args = make()
        out = apply(*args)
        outs = out if isinstance(out, tuple) else (out,)
        weights = [torch.randn(o.shape) for o in outs]
        torch.autograd.backward(outs, weights)
        results.append(([o.detach() for o in outs],
                        [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad]))
    return results, torch.get_rng_state()


def _matches_eager(fn_cls: type, make: Callable[[], tuple[Any, ...]], n: int = 3, seed: int = 0,
                   fallback: str | None = None) -> minihop.CapturedFunction:
    eager, eager_state = _calls(fn_cls.apply, make, n, seed)
    cf = minihop.function(fn_cls) if fallback is None else minihop.function(fn_cls, fallback=fallback)
    mine, mine_state = _calls(cf, make, n, seed)
    for i, ((e_out, e_grads), (m_out, m_grads)) in enumerate(zip(eager, mine, strict=True)):
        for e, m in zip(e_out, m_out, strict=True):
            assert torch.equal(m, e), f"call {i}: outputs differ"
        assert len(e_grads) == len(m_grads)
        for k, (e, m) in enumerate(zip(e_grads, m_grads, strict=True)):
            assert (e is None) == (m is None), f"call {i}: grad {k}"
            if e is not None:
                assert torch.equal(m, e), f"call {i}: grad {k} differs"
    assert torch.equal(mine_state, eager_state), "the random stream after the calls differs"
    assert cf.stats.eager_calls == 0 and cf.stats.captures == 1, cf.stats
    return cf


def _checkpoint_args(run_function: Any, preserve: bool = True) -> Callable[[], tuple[Any, ...]]:
    x0, w1, w2 = torch.randn(3, 4), torch.randn(4, 4), torch.randn(4, 4)

    def make() -> tuple[Any, ...]:
        return (run_function, preserve, x0.clone().requires_grad_(), w1.clone().requires_grad_(),
                w2.clone().requires_grad_())
    return make


@pytest.mark.parametrize("fallback", [None, "eager"], ids=["strict", "fallback"])
class TestCheckpoint:
    def test_reentrant_checkpoint_with_dropout(self, fallback: str | None) -> None:
        """torch.utils.checkpoint's CheckpointFunction: same outputs, .grad, dropout masks, stream."""
        _matches_eager(CheckpointFunction, _checkpoint_args(mlp_block), fallback=fallback)

    def test_torchs_own_checkpoint_function(self, fallback: str | None) -> None:
        """torch.utils.checkpoint.CheckpointFunction itself (the installed torch's code)."""
        from torch.utils.checkpoint import CheckpointFunction as TorchCheckpointFunction
        _matches_eager(TorchCheckpointFunction, _checkpoint_args(mlp_block), fallback=fallback)

    def test_two_outputs(self, fallback: str | None) -> None:
        """Two outputs: backward() with two grads, every input's .grad."""
        _matches_eager(CheckpointFunction, _checkpoint_args(two_outputs), fallback=fallback)

    def test_without_preserved_state(self, fallback: str | None) -> None:
        """preserve_rng_state=False: the recomputation draws fresh masks (eager's gradients are
        then not the true ones, and minihop's are eager's)."""
        _matches_eager(CheckpointFunction, _checkpoint_args(mlp_block, preserve=False), fallback=fallback)

    def test_reversible_block(self, fallback: str | None) -> None:
        """A RevNet block: inputs rebuilt from outputs in backward, two backward()s."""
        a, b, wf, wg = torch.randn(2, 3), torch.randn(2, 3), torch.randn(3, 3), torch.randn(3, 3)

        def make() -> tuple[Any, ...]:
            return tuple(t.clone().requires_grad_() for t in (a, b, wf, wg))
        _matches_eager(RevBlockFunction, make, fallback=fallback)

    def test_model_parallel_tracker(self, fallback: str | None) -> None:
        """A checkpoint with a random-state tracker object (Megatron style)."""
        x0, w0 = torch.randn(3, 4), torch.randn(4, 4)
        tracker = RngStatesTracker()
        tracker.add("model-parallel-rng", 1234)

        def make() -> tuple[Any, ...]:
            return (tracked_block, tracker, x0.clone().requires_grad_(), w0.clone().requires_grad_())
        _matches_eager(TrackedCheckpointFunction, make, fallback=fallback)


def test_masks_repeat_in_recomputation() -> None:
    """The dropout mask backward recomputes is forward's: the gradient of x is zero exactly
    where forward's output dropped the unit (checked on minihop's result, not copied from it)."""

    def drop(x: torch.Tensor) -> torch.Tensor:
        return Fn.dropout(x, 0.5, training=True)

    cf = minihop.function(CheckpointFunction)
    for _ in range(3):
        x = torch.randn(50).abs().add(0.1).requires_grad_()
        y = cf(drop, True, x)
        y.sum().backward()
        assert torch.equal(x.grad == 0, y == 0)
    assert cf.stats.captures == 1 and cf.stats.eager_calls == 0


def test_explain_names_the_recomputation() -> None:
    """explain() says the random state is replayed and backward() recomputed."""
    x, w1, w2 = (torch.randn(4, 4, requires_grad=True) for _ in range(3))
    text = str(minihop.explain(CheckpointFunction, mlp_block, True, x, w1, w2, print_report=False))
    assert "forward: torch.get_rng_state(): replayed" in text
    assert "backward: torch.set_rng_state(...): replayed" in text
    assert "backward: backward() [" in text and "]: recomputed: torch.autograd.grad" in text


# -- run_function a module: backward() accumulates into its parameters' .grad (issue 31) -----

def _module_calls(apply: Apply, module: torch.nn.Module, make: Callable[[], tuple[Any, ...]],
                  n: int, seed: int) -> tuple[list[Any], torch.Tensor]:
    """N calls sharing one module, from one seed: outputs, whether they require grad, the tensor
    arguments' .grad and every parameter's .grad after each call (they accumulate over calls,
    as in eager), and the global random state after all of them."""
    torch.manual_seed(seed)
    results = []
    for _ in range(n):
        args = make()
        out = apply(*args)
        outs = out if isinstance(out, tuple) else (out,)
        weights = [torch.randn(o.shape) for o in outs]
        if any(o.requires_grad for o in outs):
            torch.autograd.backward(outs, weights)
        results.append(([o.detach() for o in outs], [o.requires_grad for o in outs],
                        [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad],
                        [None if p.grad is None else p.grad.clone() for p in module.parameters()]))
    return results, torch.get_rng_state()


def _module_matches_eager(fn_cls: type, build: Callable[[], torch.nn.Module],
                          args: Callable[[torch.nn.Module], Callable[[], tuple[Any, ...]]],
                          mode: str, n: int = 3) -> None:
    torch.manual_seed(1)
    eager_module = build()
    mine_module = build()
    mine_module.load_state_dict(eager_module.state_dict())
    eager, eager_state = _module_calls(fn_cls.apply, eager_module, args(eager_module), n, 0)
    run: Apply = {"strict": minihop.function(fn_cls), "fallback": minihop.function(fn_cls, fallback="eager"),
                  "apply": lambda *a: minihop.apply(fn_cls, *a)}[mode]
    mine, mine_state = _module_calls(run, mine_module, args(mine_module), n, 0)
    for i, (e, m) in enumerate(zip(eager, mine, strict=True)):
        assert m[1] == e[1], f"call {i}: requires_grad of the outputs"
        for part, what in ((0, "outputs"), (2, "argument grads"), (3, "parameter grads")):
            assert len(m[part]) == len(e[part])
            for k, (ev, mv) in enumerate(zip(e[part], m[part], strict=True)):
                assert (ev is None) == (mv is None), f"call {i}: {what} {k}"
                if ev is not None:
                    assert torch.equal(mv, ev), f"call {i}: {what} {k} differ"
    assert torch.equal(mine_state, eager_state), "the random stream after the calls differs"
    if mode == "strict":
        assert run.stats.eager_calls == 0 and run.stats.captures == 1, run.stats


def _checkpoint_module_args(preserve: bool = True, requires_grad: bool = True):
    x0 = torch.randn(3, 4)

    def args(module: torch.nn.Module) -> Callable[[], tuple[Any, ...]]:
        return lambda: (module, preserve, x0.clone().requires_grad_(requires_grad))
    return args


def _sequential_with_dropout() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.GELU(),
                               torch.nn.Linear(8, 4), torch.nn.Dropout(0.1))


@pytest.mark.parametrize("mode", ["strict", "fallback", "apply"])
class TestModuleParameters:
    """``checkpoint(module, x, use_reentrant=True)``: the recomputation reads the module's own
    parameters and eager's ``torch.autograd.backward`` accumulates into their ``.grad``."""

    def test_linear(self, mode: str) -> None:
        _module_matches_eager(CheckpointFunction, lambda: torch.nn.Linear(4, 4),
                              _checkpoint_module_args(), mode)

    def test_torchs_own_checkpoint_function(self, mode: str) -> None:
        from torch.utils.checkpoint import CheckpointFunction as TorchCheckpointFunction
        _module_matches_eager(TorchCheckpointFunction, _sequential_with_dropout,
                              _checkpoint_module_args(), mode)

    def test_sequential_with_dropout(self, mode: str) -> None:
        """Dropout inside the module: the recomputation draws forward's masks (random-state
        replay) and the parameters' .grad are eager's, bit for bit."""
        _module_matches_eager(CheckpointFunction, _sequential_with_dropout, _checkpoint_module_args(), mode)

    def test_megatron_tracker_with_module(self, mode: str) -> None:
        """Megatron's CheckpointFunction with its random-state tracker, run_function an
        nn.Sequential with dropout."""
        tracker = RngStatesTracker()
        tracker.add("model-parallel-rng", 1234)
        x0 = torch.randn(3, 4)

        def args(module: torch.nn.Module) -> Callable[[], tuple[Any, ...]]:
            return lambda: (module, tracker, x0.clone().requires_grad_())
        _module_matches_eager(TrackedCheckpointFunction, _sequential_with_dropout, args, mode)

    def test_input_without_grad(self, mode: str) -> None:
        """The first layer's input needs no grad: eager's output does not require grad (the
        parameters are not the Function's inputs), and neither does minihop's."""
        _module_matches_eager(CheckpointFunction, lambda: torch.nn.Linear(4, 4),
                              _checkpoint_module_args(requires_grad=False), mode)


def test_closure_leaf_accumulates() -> None:
    """backward() into a global leaf tensor: eager accumulates into its .grad on each backward
    and the Function reads it; so does the capture."""
    w = torch.ones(3, requires_grad=True)

    class Uses(Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, g):
            with torch.enable_grad():
                (w * 2).sum().backward()
            return g * w.grad

    results = {}
    for name, run in (("eager", Uses.apply), ("strict", minihop.function(Uses))):
        w.grad = None
        grads = []
        for i in range(3):
            x = torch.randn(3, requires_grad=True, generator=torch.Generator().manual_seed(i))
            run(x).sum().backward()
            grads.append((x.grad, w.grad.clone()))
        results[name] = grads
    for (ex, ew), (mx, mw) in zip(results["eager"], results["strict"], strict=True):
        assert torch.equal(mx, ex) and torch.equal(mw, ew)


def test_own_input_not_detached_is_refused() -> None:
    """backward() through the Function's own input (not detached) is refused, coded; eager's
    reaches into the caller's graph. fallback runs it."""

    class Through(Function):
        @staticmethod
        def forward(ctx, a):
            ctx.save_for_backward(a)
            return a * 2

        @staticmethod
        def backward(ctx, g):
            a, = ctx.saved_tensors
            with torch.enable_grad():
                (a * 3).sum().backward()
            return g * 2

    x = torch.randn(3, requires_grad=True)
    with pytest.raises(minihop.SideEffectError, match=r"\[MH106\] .*backward\(\), which reaches a tensor"):
        minihop.apply(Through, x)
    cf = minihop.function(Through, fallback="eager")
    cf(x).sum().backward()
    assert cf.stats.eager_calls == 1 and torch.equal(x.grad, torch.full((3,), 5.0))
