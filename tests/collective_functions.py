"""Tensor- and sequence-parallel Functions written as the libraries write them, for
``tests/test_collectives.py`` (and ``bench/collectives.py``).

The helpers and Functions follow Megatron-LM's ``tensor_parallel/mappings.py`` (a module-level
model-parallel group, ``_reduce``/``_split``/``_gather`` helpers that call
``torch.distributed`` in place, identity Functions whose backward communicates), its MoE
``_AllToAll`` (the group and the split sizes passed to ``apply``), its ``broadcast_data``, and
the functional collectives (``torch.distributed._functional_collectives``) as DTensor-style
code calls them. Nothing here is minihop's; ``collective_worker`` runs each one eagerly and
through minihop on every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
# -- Megatron-style model-parallel state and helpers ----------------------------------------

_TENSOR_MODEL_PARALLEL_GROUP: Any = None


def get_tensor_model_parallel_group() -> Any:
    return _TENSOR_MODEL_PARALLEL_GROUP


def get_tensor_model_parallel_world_size() -> int:
    return dist.get_world_size(group=get_tensor_model_parallel_group())


def get_tensor_model_parallel_rank() -> int:
    return dist.get_rank(group=get_tensor_model_parallel_group())


def _reduce(input_: torch.Tensor) -> torch.Tensor:
    """All-reduce the input tensor across the model-parallel group (in place)."""
    if get_tensor_model_parallel_world_size() == 1:
        return input_
    dist.all_reduce(input_, group=get_tensor_model_parallel_group())
    return input_


def _split_along_last_dim(input_: torch.Tensor) -> torch.Tensor:
    world_size = get_tensor_model_parallel_world_size()
    if world_size == 1:
        return input_
    last_dim = input_.dim() - 1
    input_list = torch.split(input_, input_.size()[last_dim] // world_size, dim=last_dim)
    rank = get_tensor_model_parallel_rank()
    return input_list[rank].contiguous()


def _gather_along_last_dim(input_: torch.Tensor) -> torch.Tensor:
    """The list form of all_gather (Megatron before all_gather_into_tensor)."""
    world_size = get_tensor_model_parallel_world_size()
    if world_size == 1:
        return input_
    last_dim = input_.dim() - 1
    rank = get_tensor_model_parallel_rank()
    tensor_list = [torch.empty_like(input_) for _ in range(world_size)]
    tensor_list[rank] = input_
    dist.all_gather(tensor_list, input_, group=get_tensor_model_parallel_group())
    return torch.cat(tensor_list, dim=last_dim).contiguous()


def _split_along_first_dim(input_: torch.Tensor) -> torch.Tensor:
    world_size = get_tensor_model_parallel_world_size()
    if world_size == 1:
        return input_
    local_dim_size = input_.size()[0] // world_size
    dim_offset = get_tensor_model_parallel_rank() * local_dim_size
    return input_[dim_offset:dim_offset + local_dim_size].contiguous()


def _gather_along_first_dim(input_: torch.Tensor) -> torch.Tensor:
    world_size = get_tensor_model_parallel_world_size()
    if world_size == 1:
        return input_
    dim_size = list(input_.size())
    dim_size[0] = dim_size[0] * world_size
    output = torch.empty(dim_size, dtype=input_.dtype, device=input_.device)
    dist.all_gather_into_tensor(output, input_.contiguous(), group=get_tensor_model_parallel_group())
    return output


def _reduce_scatter_along_first_dim(input_: torch.Tensor) -> torch.Tensor:
    world_size = get_tensor_model_parallel_world_size()
    if world_size == 1:
        return input_
    dim_size = list(input_.size())
    dim_size[0] = dim_size[0] // world_size
    output = torch.empty(dim_size, dtype=input_.dtype, device=input_.device)
    dist.reduce_scatter_tensor(output, input_.contiguous(), group=get_tensor_model_parallel_group())
    return output


class _CopyToModelParallelRegion(torch.autograd.Function):
    """Pass the input to the model parallel region."""

    @staticmethod
    def forward(ctx: Any, input_: torch.Tensor) -> torch.Tensor:
        return input_

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return _reduce(grad_output)


class _ReduceFromModelParallelRegion(torch.autograd.Function):
    """All-reduce the input from the model parallel region."""

    @staticmethod
    def forward(ctx: Any, input_: torch.Tensor) -> torch.Tensor:
        return _reduce(input_)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output


class _ScatterToModelParallelRegion(torch.autograd.Function):
    """Split the input and keep only the chunk corresponding to the rank."""

    @staticmethod
    def forward(ctx: Any, input_: torch.Tensor) -> torch.Tensor:
        return _split_along_last_dim(input_)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return _gather_along_last_dim(grad_output)


class _GatherFromModelParallelRegion(torch.autograd.Function):
    """Gather the input from the model parallel region and concatenate."""

    @staticmethod
    def forward(ctx: Any, input_: torch.Tensor) -> torch.Tensor:
        return _gather_along_last_dim(input_)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return _split_along_last_dim(grad_output)


class _ScatterToSequenceParallelRegion(torch.autograd.Function):
    """Split the input and keep only the chunk corresponding to the rank."""

    @staticmethod
    def forward(ctx: Any, input_: torch.Tensor) -> torch.Tensor:
        return _split_along_first_dim(input_)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return _gather_along_first_dim(grad_output)


class _GatherFromSequenceParallelRegion(torch.autograd.Function):
    """Gather the input from the sequence parallel region and concatenate."""

    @staticmethod
    def forward(ctx: Any, input_: torch.Tensor) -> torch.Tensor:
        return _gather_along_first_dim(input_)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return _reduce_scatter_along_first_dim(grad_output)


class _ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """Reduce scatter the input from the model parallel region."""

    @staticmethod
    def forward(ctx: Any, input_: torch.Tensor) -> torch.Tensor:
        return _reduce_scatter_along_first_dim(input_)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return _gather_along_first_dim(grad_output)


class _AllToAll(torch.autograd.Function):
    """Megatron MoE's token dispatch: all_to_all_single, the group and splits passed in."""

    @staticmethod
    def forward(ctx: Any, group: Any, input: torch.Tensor, output_split_sizes: Any,
                input_split_sizes: Any) -> torch.Tensor:
        ctx.group = group
        ctx.output_split_sizes = output_split_sizes
        ctx.input_split_sizes = input_split_sizes
        world_size = dist.get_world_size(group=group)
        if world_size == 1:
            return input
        input = input.contiguous()
        if output_split_sizes is None:
            output = torch.empty_like(input)  # equal split
        else:
            output = input.new_empty(size=[sum(output_split_sizes)] + list(input.size()[1:]))
        dist.all_to_all_single(output, input, output_split_sizes=output_split_sizes,
                               input_split_sizes=input_split_sizes, group=group)
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        grad_output = grad_output.contiguous()
        if ctx.input_split_sizes is None:
            grad_input = torch.empty_like(grad_output)
        else:
            grad_input = grad_output.new_empty(size=[sum(ctx.input_split_sizes)] + list(grad_output.size()[1:]))
        dist.all_to_all_single(grad_input, grad_output, output_split_sizes=ctx.input_split_sizes,
                               input_split_sizes=ctx.output_split_sizes, group=ctx.group)
        return None, grad_input, None, None


def get_tensor_model_parallel_src_rank() -> int:
    """The global rank of the first rank of this rank's model-parallel group."""
    global_rank = dist.get_rank()
    local_world_size = get_tensor_model_parallel_world_size()
    return (global_rank // local_world_size) * local_world_size


class BroadcastFromSource(torch.autograd.Function):
    """Megatron's ``broadcast_data`` as a Function: every rank of the model-parallel group gets
    its source rank's tensor; the gradient, summed over the group, goes to the source."""

    @staticmethod
    def forward(ctx: Any, input_: torch.Tensor) -> torch.Tensor:
        output = input_.clone()
        dist.broadcast(output, get_tensor_model_parallel_src_rank(), group=get_tensor_model_parallel_group())
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        grad = _reduce(grad_output.clone())
        if dist.get_rank() != get_tensor_model_parallel_src_rank():
            grad.zero_()
        return grad


class FunctionalSequenceParallel(torch.autograd.Function):
    """The functional collectives (DTensor's spelling): all_gather_tensor forward,
    reduce_scatter_tensor backward, then an all_reduce of a max."""

    @staticmethod
    def forward(ctx: Any, input_: torch.Tensor) -> torch.Tensor:
        gathered = funcol.all_gather_single(input_, 0, dist.group.WORLD)
        return gathered * 2

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        grad = funcol.reduce_scatter_single(grad_output, "sum", 0, dist.group.WORLD)
        scale = funcol.all_reduce(grad.abs().amax(), "max", dist.group.WORLD)
        return grad * 2 / (1 + scale)


class ScaleAfterReduce(torch.autograd.Function):
    """Uses the buffer after the in-place collective (``y`` reads the communicated value)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        dist.all_reduce(y)
        return y * 3

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        grad = g * 3
        dist.all_reduce(grad)
        return grad


# -- the patterns, each with its two sizes (the second through automatic dynamic) ----------

def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


# name -> (Function, builder of its positional args for a size and the world size, sizes)
PATTERNS: dict[str, tuple[type, Callable[[int, int], tuple[Any, ...]], tuple[int, int, int]]] = {
    "copy_to_tp": (_CopyToModelParallelRegion, lambda n, w: (_x(n, 4),), (3, 5, 7)),
    "reduce_from_tp": (_ReduceFromModelParallelRegion, lambda n, w: (_x(n, 4),), (3, 5, 7)),
    "scatter_to_tp": (_ScatterToModelParallelRegion, lambda n, w: (_x(n, 2 * w),), (3, 5, 7)),
    "gather_from_tp": (_GatherFromModelParallelRegion, lambda n, w: (_x(n, 3),), (3, 5, 7)),
    "scatter_to_sp": (_ScatterToSequenceParallelRegion, lambda n, w: (_x(n * w, 3),), (2, 3, 4)),
    "gather_from_sp": (_GatherFromSequenceParallelRegion, lambda n, w: (_x(n, 3),), (2, 3, 4)),
    "reduce_scatter_sp": (_ReduceScatterToSequenceParallelRegion, lambda n, w: (_x(n * w, 3),), (2, 3, 4)),
    "all_to_all": (_AllToAll, lambda n, w: (get_tensor_model_parallel_group(), _x(n * w, 3), None, None),
                   (2, 3, 4)),
    "broadcast": (BroadcastFromSource, lambda n, w: (_x(n, 3),), (3, 5, 7)),
    "functional": (FunctionalSequenceParallel, lambda n, w: (_x(n, 3),), (2, 3, 4)),
    "reduce_then_scale": (ScaleAfterReduce, lambda n, w: (_x(n, 3),), (2, 3, 4)),
}
