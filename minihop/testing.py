"""Testing helpers: check a capture against eager PyTorch in one call.

Not part of the pipeline; a consumer of the public API. ``assert_matches_eager`` captures a
Function, runs the capture and eager ``F.apply`` on separate clones of the same arguments,
and compares outputs (values, structure, ``requires_grad``, aliasing with inputs), every
input's ``.grad`` after the same backward, and the pair's graph contract.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .api import capture
from .rewire.contract import check_consistent
from .runtime.capture import Capture
from .structure import Path, format_path, iter_leaves, replace_tensors

__all__ = ["assert_matches_eager", "clone_args", "EagerComparison"]


@dataclasses.dataclass(frozen=True)
class EagerComparison:
    """What ``assert_matches_eager`` compared, for further assertions."""

    capture: Capture
    eager_output: Any
    captured_output: Any
    eager_args: tuple[Any, ...]
    captured_args: tuple[Any, ...]


def clone_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Fresh leaf copies of every tensor in ``args`` (same values and ``requires_grad``)."""
    memo: dict[int, torch.Tensor] = {}

    def clone(_path: Path, t: torch.Tensor) -> torch.Tensor:
        if id(t) not in memo:
            c = t.detach().clone()
            if t.requires_grad:
                c.requires_grad_(True)
            memo[id(t)] = c
        return memo[id(t)]

    return tuple(replace_tensors(a, clone, (("arg", i),)) for i, a in enumerate(args))


def _loss(output: Any, seed: int) -> torch.Tensor | None:
    gen = torch.Generator().manual_seed(seed)
    total: torch.Tensor | None = None
    for _, leaf in iter_leaves(output):
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad and leaf.is_floating_point():
            w = torch.randn(leaf.shape, generator=gen, dtype=leaf.dtype).to(leaf.device)
            term = (leaf * w).sum()
            total = term if total is None else total + term
    return total


def assert_matches_eager(fn_cls: type, *args: Any, rtol: float | None = None,
                         atol: float | None = None, backward: bool = True,
                         **kwargs: Any) -> EagerComparison:
    """Capture ``fn_cls`` and assert it behaves like ``fn_cls.apply`` on these arguments."""
    cap = capture(fn_cls, *args, **kwargs)
    check_consistent(cap.fwd, cap.bwd)
    eager_args = clone_args(args)
    mine_args = clone_args(args)
    eager_kwargs = dict(zip(kwargs, clone_args(tuple(kwargs.values())), strict=True))
    mine_kwargs = dict(zip(kwargs, clone_args(tuple(kwargs.values())), strict=True))
    eager_out = fn_cls.apply(*eager_args, **eager_kwargs)
    mine_out = cap(*mine_args, **mine_kwargs)

    eager_inputs = {id(t): p for p, t in iter_leaves((eager_args, eager_kwargs)) if isinstance(t, torch.Tensor)}
    mine_inputs = {id(t): p for p, t in iter_leaves((mine_args, mine_kwargs)) if isinstance(t, torch.Tensor)}
    eager_leaves = list(iter_leaves(eager_out))
    mine_leaves = list(iter_leaves(mine_out))
    assert type(eager_out) is type(mine_out), (
        f"output type differs: eager {type(eager_out).__name__}, minihop {type(mine_out).__name__}")
    assert [p for p, _ in eager_leaves] == [p for p, _ in mine_leaves], (
        f"output structure differs:\n  eager:   {[format_path(p) for p, _ in eager_leaves]}\n"
        f"  minihop: {[format_path(p) for p, _ in mine_leaves]}")
    for (path, e), (_, m) in zip(eager_leaves, mine_leaves, strict=True):
        where = f"output{format_path(path)}"
        if isinstance(e, torch.Tensor):
            assert isinstance(m, torch.Tensor), f"{where}: eager gives a tensor, minihop {type(m).__name__}"
            torch.testing.assert_close(m, e, rtol=rtol, atol=atol, equal_nan=True, msg=lambda s: f"{where}: {s}")
            assert m.requires_grad == e.requires_grad, (
                f"{where}: requires_grad eager={e.requires_grad} minihop={m.requires_grad}")
            assert (id(m) in mine_inputs) == (id(e) in eager_inputs), (
                f"{where}: eager output {'is' if id(e) in eager_inputs else 'is not'} an input object; "
                f"minihop's {'is' if id(m) in mine_inputs else 'is not'}")
        else:
            assert type(e) is type(m) and e == m, f"{where}: eager {e!r}, minihop {m!r}"

    if backward:
        eager_loss = _loss(eager_out, 0)
        mine_loss = _loss(mine_out, 0)
        assert (eager_loss is None) == (mine_loss is None), "one side has no differentiable output"
        if eager_loss is not None and mine_loss is not None:
            eager_loss.backward()
            mine_loss.backward()
        eager_grads = [(p, t.grad) for p, t in iter_leaves((eager_args, eager_kwargs)) if isinstance(t, torch.Tensor)]
        mine_grads = [(p, t.grad) for p, t in iter_leaves((mine_args, mine_kwargs)) if isinstance(t, torch.Tensor)]
        for (path, eg), (_, mg) in zip(eager_grads, mine_grads, strict=True):
            where = f"grad of {format_path(path)}"
            assert (eg is None) == (mg is None), f"{where}: eager {'None' if eg is None else 'a tensor'}, minihop {'None' if mg is None else 'a tensor'}"
            if eg is not None:
                torch.testing.assert_close(mg, eg, rtol=rtol, atol=atol, equal_nan=True, msg=lambda s: f"{where}: {s}")
    return EagerComparison(cap, eager_out, mine_out, eager_args, mine_args)
