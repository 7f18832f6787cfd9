"""The value types the tracer treats as plain values: one place for every "atomic" tuple.

Place in the pipeline: tracer, imported by the heap watch (``heap``), ``hidden``, ``iterators``,
``identity`` and ``effects``. ``CONSTANTS`` are Python's immutable scalars; ``ATOMS`` adds
torch's immutable descriptors (what a Python write may replay as it is); ``LEAVES`` adds
tensors and classes (what a walk for iterators never looks into). ``atom_tuple`` and
``holds_tensor`` test a value against them.

Invariant: every tuple here is immutable values only; a type that can hold mutable state
(a list, an object, a module) is never in one.
"""

from __future__ import annotations

import torch

from typing import Any

__all__ = ["ATOMS", "CONSTANTS", "LEAVES", "atom_tuple", "holds_tensor"]

CONSTANTS = (int, float, bool, str, bytes, complex, type(None))
ATOMS = (*CONSTANTS, torch.dtype, torch.device, torch.Size)
LEAVES = (*CONSTANTS, torch.Tensor, type)


def atom_tuple(value: Any) -> bool:
    """A tuple of atoms (however nested): a value, as an atom is."""
    return issubclass(type(value), tuple) and all(issubclass(type(v), ATOMS) or atom_tuple(v) for v in value)


def holds_tensor(value: Any) -> bool:
    """A tensor, or a list, tuple or dict holding one (however nested)."""
    if issubclass(type(value), torch.Tensor):
        return True
    items = value.values() if issubclass(type(value), dict) else value if issubclass(type(value), (list, tuple)) else ()
    return any(holds_tensor(v) for v in items)
