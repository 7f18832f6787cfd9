"""``torch.distributed`` collectives in a Function: recorded as functional collectives, or refused.

Place in the pipeline: tracer, asked by ``recorder.RecordingMode`` for every call whose
function is one of ``torch.distributed``'s (they reach a torch function mode as themselves:
c10d hands them to ``handle_torch_function`` for tracers such as this one). An in-place
collective (``dist.all_reduce(t)``) writes into its buffer from C++: run on fake tensors it
writes nothing, and a graph without it would return the un-communicated buffer. So each
in-place collective becomes what Dynamo records for it: the functional collective
(``torch.ops._c10d_functional.all_reduce(t, 'sum', '0')``, the group by name), its
``wait_tensor``, and ``t.copy_(...)``, the write eager makes, recorded like any other
in-place write. The functional forms (``torch.distributed._functional_collectives``) need
nothing: their ops are recorded as they are called.

The rewrite is torch's own (``traceable_collective_remaps``, the table Dynamo and non-strict
export use), run with the recording mode re-entered so each op it calls is recorded;
``broadcast``, which that table lacks, is written the same way (functional broadcast,
``wait_tensor``, ``copy_``). Everything else that communicates (``send``/``recv``, an
``async_op=True`` work handle, a collective without a functional form, ``barrier``) is
refused (MH104): never run once while tracing and dropped from the graphs.

The process group a capture was made in is a guarded value (``world_places``): the graphs
hold the rank, the world size and group names as constants, so a capture is valid only in
the world it was made in.

Invariant: a call into ``torch.distributed`` while tracing is either in the graph, in the form
eager's effect has, or a coded refusal.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
from typing import Any

import torch

from ..errors import UnsupportedOperationError
from ..spec import NO_WORLD, Place
from .roots import value_place

__all__ = ["WRITE_BACK", "is_collective", "record", "world_places"]

_C10D = "torch.distributed.distributed_c10d"
# node.meta key on a collective's write-back into its buffer (``t.copy_(wait_tensor)``): the
# c10d function's name.
WRITE_BACK = "minihop_collective"
_P2P = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv"})


def is_collective(func: Any) -> bool:
    """Whether ``func`` (a call the recording mode sees) is one of ``torch.distributed``'s:
    a c10d function (``dist.all_reduce``) or a c10d op (``torch.ops.c10d.barrier``)."""
    kind = type(func)
    if kind is types.FunctionType:
        return func.__module__ == _C10D
    return issubclass(type(func), torch._ops.OpOverload) and func.namespace == "c10d"


@functools.lru_cache(maxsize=1)
def _rules() -> dict[Any, Callable[..., Any]]:
    """c10d function -> the function that records its functional form (torch's own table,
    plus broadcast); point-to-point entries of torch's table are left out (refused)."""
    import torch.distributed as dist
    from torch.distributed._functional_collectives import traceable_collective_remaps

    rules = {fn: remap for fn, remap in traceable_collective_remaps.items()
             if fn.__name__ not in _P2P}
    rules[dist.broadcast] = _broadcast
    return rules


def _broadcast(tensor: torch.Tensor, src: int | None = None, group: Any = None,
               async_op: bool = False, group_src: int | None = None) -> None:
    """``dist.broadcast`` as the functional broadcast (whose root is a rank in the group,
    as c10d's own ``broadcast`` turns ``src`` into) written back into ``tensor``."""
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as funcol

    group = group or dist.group.WORLD
    if group_src is None:
        group_src = src if group is dist.group.WORLD else dist.get_group_rank(group, src)
    tensor.copy_(funcol.broadcast(tensor, group_src, group))


def _refuse(describe: str, name: str, why: str, todo: str, where: str | None) -> UnsupportedOperationError:
    return UnsupportedOperationError(
        f"{describe} calls torch.distributed.{name}, {why}",
        "minihop records a collective as a functional collective node (torch.ops._c10d_functional"
        ".*, then wait_tensor) that runs on every call; a call it cannot write so would "
        "communicate once, while tracing, and never again when the graphs run.",
        todo, where=where)


_EAGER = "or run this Function eagerly (minihop.function(F, fallback='eager'))."


def record(mode: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
           describe: str, where: str | None) -> Any:
    """Run ``func(*args, **kwargs)``, a ``torch.distributed`` call made while ``mode`` records
    (``describe``: ``"F.forward"``), as its functional form, each op recorded; or refuse it."""
    import torch.distributed as dist
    from torch.distributed._functional_collectives import REDUCE_OP_TO_STR

    name = getattr(func, "__name__", None) or str(func)
    if issubclass(type(func), types.FunctionType) and not dist.is_initialized():
        return func(*args, **kwargs)  # eager's own error: no process group (touches no tensor)
    if not issubclass(type(func), types.FunctionType):
        raise _refuse(describe, name, "a c10d operator with no functional form.",
                      "Call it outside the Function, " + _EAGER, where)
    if func.__name__ in _P2P:
        raise _refuse(describe, name, "a point-to-point transfer.",
                      "Use a collective (all_to_all_single, broadcast) in the Function, or send "
                      "and receive outside it, " + _EAGER, where)
    rule = _rules().get(func)
    if rule is None:
        raise _refuse(describe, name, "a collective minihop has no functional form for.",
                      "Use all_reduce, all_gather_into_tensor, reduce_scatter_tensor, "
                      "all_to_all_single, all_gather or broadcast (or torch.distributed."
                      "_functional_collectives), " + _EAGER, where)
    bound = dict(inspect.signature(func).bind(*args, **kwargs).arguments)
    if bound.get("async_op"):
        raise _refuse(describe, name, "with async_op=True.",
                      "Call it with async_op=False (the default): a work handle waited on "
                      "later is not a value a graph can hold; " + _EAGER, where)
    group = bound.get("group")
    if group is not None and not issubclass(type(group), dist.ProcessGroup):
        raise _refuse(describe, name, f"with a group of type {type(group).__name__}.",
                      "Pass a torch.distributed.ProcessGroup (or none, the default group), "
                      + _EAGER, where)
    if group is not None and dist.get_rank(group) < 0:
        raise _refuse(describe, name, "on a group this rank is not a member of.",
                      "Call it only on the group's ranks, " + _EAGER, where)
    if "op" in bound:
        op = bound["op"]
        if op not in REDUCE_OP_TO_STR:
            raise _refuse(describe, name, f"with reduce op {op!r}.",
                          "Use one of " + ", ".join(str(o) for o in REDUCE_OP_TO_STR) + ", "
                          + _EAGER, where)
        bound["op"] = REDUCE_OP_TO_STR[op]
    for value in bound.values():
        for t in value if issubclass(type(value), (list, tuple)) else (value,):
            if issubclass(type(t), torch.Tensor) and t.is_complex():
                raise _refuse(describe, name, "on a complex tensor.",
                              "Communicate torch.view_as_real(t), " + _EAGER, where)
    recorder = mode.recorder
    first = len(recorder.mutations)
    try:
        with mode:  # re-entered: the ops the functional form calls are recorded
            rule(**bound)
    except AssertionError as e:  # torch's rewrite refuses a call (all_gather of unequal sizes)
        raise _refuse(describe, name, f"in a form minihop cannot write as a functional "
                      f"collective.\n  found: {e}", "Use tensors of equal sizes, " + _EAGER,
                      where) from e
    for node, written in recorder.mutations[first:]:
        # The write-back eager's collective makes into its buffer (see trace's mutation check).
        node.meta[WRITE_BACK] = name
    # The c10d call returns None: no operand of the user's next op is the write's result
    # (``recorder.record`` may have taken the write-back for one, reading the user's frame as
    # if the copy_ were the user's call); later uses of a buffer read its own node, as Dynamo's.
    recorder.pending_alias = None
    return None  # what the c10d call returns with async_op=False


def _default_group() -> Any:
    from torch.distributed import distributed_c10d

    return distributed_c10d._world.default_pg


def world_places() -> tuple[Place, ...]:
    """The process group as a guarded place (none initialised included): the graphs hold the
    rank, the world size and group names as constants (``chunk(2)[0]``), so a capture made in
    one world (a default group's rank of its size) is not run in another. One identity check
    per call; a ProcessGroup's rank and size never change."""
    if not torch.distributed.is_available():
        return ()
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    group = _default_group()
    # None is guarded too: a capture made before init_process_group (a branch on
    # dist.is_initialized(), a collective that is then eager's error) is not one for after it.
    text = (NO_WORLD if group is None else
            f"torch.distributed's process group (rank {dist.get_rank()} of {dist.get_world_size()})")
    c10d = distributed_c10d  # read through the module on each call (no import per call: a hot path)
    # (``_default_pg``: what the ``default_pg`` property returns, without its call on each hit)
    return (value_place(text, lambda args: c10d._world._default_pg),)
