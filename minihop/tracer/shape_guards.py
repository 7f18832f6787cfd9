"""Dynamic shapes at the trace's edges: the ShapeEnv a trace makes, and the guard code it leaves.

Place in the pipeline: tracer. ``shape_env`` is the ShapeEnv of a trace with dynamic sizes or
data-dependent values; ``ArgSource`` names a dynamic argument for it; after forward and
backward ran, ``shape_guards`` turns what the trace assumed of the dynamic sizes into code over
the dynamic arguments (``ShapeGuards``), which the runtime checks on every call.

Invariant: every size the trace fixed to one value (specialised 0 or 1, or pinned by the
code) is in the guard, also where torch's ``produce_guards`` leaves it to Dynamo's own tensor
checks, which minihop does not have.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch._guards import GuardSource, Source
from torch.fx.experimental.symbolic_shapes import ShapeEnv

__all__ = ["ArgSource", "ShapeGuards", "shape_env", "shape_guards"]


@dataclasses.dataclass(frozen=True)
class ArgSource(Source):
    """Names a dynamic argument for the ShapeEnv (``x``; ``T[0]`` in guard code)."""

    path: str

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.path

    def guard_source(self) -> GuardSource:
        return GuardSource.LOCAL


@dataclasses.dataclass(frozen=True)
class ShapeGuards:
    """Guard code over the dynamic arguments ``T`` (``args[i]`` for i in ``arg_indices``)."""

    arg_indices: tuple[int, ...]
    expression: str
    # (argument position, dimension, size) of each dynamic dimension the trace fixed to one
    # size: a size of 0 or 1 (specialised as Dynamo does), or one the code pinned (``== 5``);
    # dimension -1 for a dynamic int argument.
    fixed: tuple[tuple[int, int, int], ...] = ()


def shape_env() -> ShapeEnv:
    # Data-dependent sizes and scalars become unbacked symbols (see unbacked); a guard on one
    # falls back to a value read or is refused there, never torch's own exception.
    return ShapeEnv(allow_dynamic_output_shape_ops=True, allow_scalar_outputs=True)


def shape_guards(env: ShapeEnv | None, dynamic_fakes: list[tuple[int, Any]],
                 dynamic: dict[int, tuple[int, ...]]) -> ShapeGuards | None:
    """What the trace assumed of the dynamic sizes, as code over the dynamic arguments:
    ``dynamic_fakes`` holds (argument position, fake tensor or SymInt) per dynamic argument,
    ``dynamic`` the dynamic dimensions of each."""
    if env is None or not dynamic_fakes:
        return None
    fakes = [fake for _, fake in dynamic_fakes]
    sources = [ArgSource(f"T[{i}]") for i in range(len(fakes))]
    guards = env.produce_guards(fakes, sources)
    # A dynamic size the trace fixed to one value (torch.tensor(x.shape[0]), int(n * 0.5)), or
    # that the ShapeEnv never made a symbol (a size of 0 or 1, specialised: broadcasting and
    # empty tensors take other code for them): produce_guards leaves size == constant to
    # Dynamo's own tensor checks, which minihop has not, so it is guarded here.
    fixed = []
    for i, (arg_index, fake) in enumerate(dynamic_fakes):
        if not issubclass(type(fake), torch.Tensor):  # a dynamic int argument
            # 0 and 1 stay plain ints (produce_guards pins them); a SymInt the code pinned is
            # guarded here, as a pinned size is.
            pinned = issubclass(type(fake), torch.SymInt) and fake.node.expr.is_Integer
            if pinned:
                guards.append(f"T[{i}] == {int(fake)}")
            if pinned or not issubclass(type(fake), torch.SymInt):
                fixed.append((arg_index, -1, int(fake)))
            continue
        for d in dynamic[arg_index]:
            size = fake.shape[d]
            expr = size.node.expr if issubclass(type(size), torch.SymInt) else None
            if expr is None or expr.is_Integer:
                guards.append(f"T[{i}].size()[{d}] == {int(size)}")
                fixed.append((arg_index, d, int(size)))
    return ShapeGuards(tuple(i for i, _ in dynamic_fakes), " and ".join(guards) or "True",
                       tuple(fixed))
