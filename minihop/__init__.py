"""minihop: capture a ``torch.autograd.Function`` into two consistent torch.fx graphs.

What PyTorch's compiler does when it meets a user's autograd.Function, without
Dynamo (PyTorch's bytecode tracer): trace ``forward`` and ``backward`` on fake tensors, rewire the two graphs
into a consistent pair, and run them as one differentiable op.

    >>> import torch, minihop
    >>> class MySin(torch.autograd.Function):
    ...     @staticmethod
    ...     def forward(ctx, x):
    ...         ctx.save_for_backward(x)
    ...         return x.sin()
    ...     @staticmethod
    ...     def backward(ctx, grad):
    ...         (x,) = ctx.saved_tensors
    ...         return grad * x.cos()
    >>> x = torch.randn(8, requires_grad=True)
    >>> cap = minihop.capture(MySin, x)      # print(cap) shows fwd_body_0 and bwd_body_0
    >>> cap
    Capture(MySin, x: f32[8] grad)
    >>> cap(x).sum().backward()              # runs fwd_body_0, then bwd_body_0
    >>> torch.allclose(x.grad, x.detach().cos())
    True
    >>> minihop.testing.assert_matches_eager(MySin, x).capture.name   # the oracle check
    'MySin'

The public functions (each has an example in its docstring):
  capture(F, *args, dynamic=False)   a ``Capture``: ``.fwd``, ``.bwd``, ``.graph``; call it like F.apply
  apply(F, *args)                    drop-in for ``F.apply``, through a guarded cache of captures
  function(F, fallback=..., ...)     a ``CapturedFunction``: F.apply with its own cache and policy
  captured                           class decorator: ``F.apply`` itself goes through minihop
  trace(fn, *args)                   a function or module applying Functions, as one GraphModule
  explain(F, *args)                  an ``Explanation``: how each ctx feature was handled, the guards
  load(path)                         a capture saved with ``Capture.save``
  check_consistent(fwd, bwd)         the graph contract on anyone's pair: a ``PairShape``
  testing                            the oracle toolkit (``assert_matches_eager``, ...; docs/oracle.md)
Errors: ``MinihopError`` and its subclasses, each with a code (MHnnn; docs/unsupported.md).

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
from .cache import CacheStats, CapturedFunction
from .entries import apply, captured, clear_cache, counters, function, reset
from .errors import (
    BackwardOutputError,
    CtxArgumentError,
    DataDependentError,
    GuardMismatchError,
    InconsistentGraphsError,
    InplaceInputError,
    MinihopError,
    MinihopWarning,
    SideEffectError,
    UnsupportedArgumentError,
    UnsupportedOperationError,
    UnsupportedOutputError,
)
from .explain import Explanation, explain
from .pipeline import Capture, PairShape, capture, check_consistent, load, trace, with_graphs

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
    "MinihopWarning",
    "PairShape",
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
