"""How a minihop function is copied and pickled: as a Python function is.

Place in the pipeline: above it, a base of ``cache.CapturedFunction``. A model that holds
``minihop.function(F)`` (or a ``@captured`` class's ``apply``) is deep-copied for an EMA or a
teacher, and pickled by ``torch.save(model)`` or a spawned worker; eager's ``F.apply`` goes
along by reference (a class's method), so neither ever fails for it. A minihop function holds a
lock and its captures: copies share it, as copies of a model share a function (its captures are
keyed and guarded by what each call passes, not by whose module calls), and pickling names how
it is made again (``minihop.function(F, ...)`` with the same policy, ``F.minihop`` for
``@captured``), never its captures.

Invariant: a copy or an unpickled minihop function runs ``F`` under the same policy.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CopiedAsFunction"]


class CopiedAsFunction:
    """``copy.copy``/``copy.deepcopy`` give the object itself; ``pickle`` names how it is made."""

    fn_cls: type
    fallback: Any
    dynamic: Any
    cache_limit: int

    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return self

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        if getattr(self, "stream", None) is not None:
            raise TypeError(f"a minihop function of {self.fn_cls.__qualname__} on a CUDA stream cannot be pickled: "
                            "the stream is this process's (make it again with minihop.function(F, stream=...))")
        if getattr(self.fn_cls, "minihop", None) is self:  # (@captured: the class's own)
            return getattr, (self.fn_cls, "minihop")
        return _remade, (type(self), self.fn_cls, self.fallback, self.dynamic, self.cache_limit)


def _remade(cls: type, fn_cls: type, fallback: Any, dynamic: Any, cache_limit: int) -> Any:
    return cls(fn_cls, fallback=fallback, dynamic=dynamic, cache_limit=cache_limit)
