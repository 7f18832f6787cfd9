"""The value types the tracer treats as plain values: one place for every "atomic" tuple.

Place in the pipeline: tracer, imported by the heap watch (``heap``), ``hidden``, ``iterators``
and ``effects``. ``CONSTANTS`` are Python's immutable scalars; ``ATOMS`` adds torch's immutable
descriptors (what a Python write may replay as it is); ``LEAVES`` adds tensors and classes
(what a walk for iterators never looks into).

Invariant: every tuple here is immutable values only; a type that can hold mutable state
(a list, an object, a module) is never in one.
"""

from __future__ import annotations

import torch

__all__ = ["ATOMS", "CONSTANTS", "LEAVES"]

CONSTANTS = (int, float, bool, str, bytes, complex, type(None))
ATOMS = (*CONSTANTS, torch.dtype, torch.device, torch.Size)
LEAVES = (*CONSTANTS, torch.Tensor, type)
