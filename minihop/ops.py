"""minihop's standalone operators (public namespace ``minihop.ops``).

``autograd_function_apply(fwd, bwd, *args, non_differentiable_idx=..., saved_for_backward_idx=...,
dirty_idx=...)`` runs any consistent pair, minihop's or another system's, as one differentiable
op (implemented in the runtime stage, ``runtime/op.py``).
"""

from .pipeline import autograd_function_apply

__all__ = ["autograd_function_apply"]
