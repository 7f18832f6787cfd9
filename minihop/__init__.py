"""minihop: capture a ``torch.autograd.Function`` into two consistent torch.fx graphs.

What PyTorch's compiler does when it meets a user's autograd.Function, without
Dynamo (PyTorch's bytecode tracer): trace ``forward`` and ``backward`` on fake tensors, rewire the two graphs
into a consistent pair, and run them as one differentiable op.

Vocabulary (used throughout):
  fwd, bwd      the two graphs, ``fwd_body_0`` and ``bwd_body_0`` in printed form.
  fwd inputs    the fwd graph's placeholders: tensors forward touched (first use order),
                then tensor arguments it never used. *Lifted* inputs are tensors pulled out
                of objects, containers or closures; they never receive gradients.
  saved         values bwd needs from fwd, returned by fwd after its outputs and taken by bwd
                after its grads, in the order bwd first reads them.
  grads         bwd's first inputs, one per fwd tensor output; ``unused_N`` if never read.
  non_differentiable_idx, dirty_idx
                fwd output positions marked by ``ctx.mark_non_differentiable``/``mark_dirty``.

Pipeline: ``tracer`` -> ``rewire`` -> ``runtime``, run in one place, ``pipeline`` (see
docs/ARCHITECTURE.md); everything here calls it.
"""

from . import ops  # the public op namespace: ``minihop.ops.autograd_function_apply`` after ``import minihop``
from .cache import CacheStats, CapturedFunction, apply, captured, clear_cache, counters, function, reset
from .errors import (
    BackwardOutputError,
    CtxArgumentError,
    DataDependentError,
    GuardMismatchError,
    InconsistentGraphsError,
    InplaceInputError,
    MinihopError,
    SideEffectError,
    UnsupportedArgumentError,
    UnsupportedOperationError,
    UnsupportedOutputError,
)
from .explain import Explanation, explain
from .pipeline import Capture, capture, check_consistent, load, trace, with_graphs

__all__ = [
    "BackwardOutputError",
    "CacheStats",
    "Capture",
    "CapturedFunction",
    "CtxArgumentError",
    "DataDependentError",
    "Explanation",
    "GuardMismatchError",
    "InconsistentGraphsError",
    "InplaceInputError",
    "MinihopError",
    "SideEffectError",
    "UnsupportedArgumentError",
    "UnsupportedOperationError",
    "UnsupportedOutputError",
    "apply",
    "capture",
    "captured",
    "check_consistent",
    "clear_cache",
    "counters",
    "explain",
    "function",
    "load",
    "ops",
    "reset",
    "testing",
    "trace",
    "with_graphs",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``minihop.testing`` (the oracle toolkit: ``minihop.testing.assert_matches_eager`` after
    ``import minihop``) loads on first use: a capture does not need it, and a fresh process
    pays for every module it imports."""
    if name == "testing":
        import importlib

        return importlib.import_module(".testing", __name__)  # sets ``minihop.testing``
    raise AttributeError(f"module 'minihop' has no attribute {name!r}")
