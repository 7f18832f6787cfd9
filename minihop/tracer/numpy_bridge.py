"""NumPy round trips on tensor data, traced as torch ops.

Place in the pipeline: tracer, called by ``recorder.RecordingMode`` for ``tensor.numpy()`` and
``torch.from_numpy(array)`` / ``torch.as_tensor(array)`` while the user's code runs on fake
tensors. A fake tensor has no values to give numpy, so ``.numpy()`` returns a ``TracedArray``: a
``torch._numpy.ndarray`` (torch's implementation of the NumPy API on tensors, the one Dynamo's
numpy support traces through) over the fake tensor. NumPy's own functions called on it
(``np.tanh(a)``, ``np.exp``, ``np.where``, ``np.linalg.norm``) reach it through NumPy's
``__array_ufunc__``/``__array_function__`` protocols and run as ``torch._numpy``'s function of the
same name, so their torch ops are recorded into the graph like any other; the array's own
operators and methods (``a * 2``, ``a.sum()``) are ``torch._numpy``'s already.
``torch.from_numpy`` of such an array is its tensor.

Invariant: a NumPy function that ``torch._numpy`` does not implement, or a ufunc method other
than a plain call (``np.add.reduce``), is refused (``DataDependentError``, MH103) naming the
NumPy call; nothing is computed on values the trace does not have.
"""

from __future__ import annotations

from typing import Any

import torch
import torch._numpy as tnp

from ..errors import DataDependentError

__all__ = ["TracedArray", "from_array", "to_array"]


def _refuse(call: str, where: str | None) -> DataDependentError:
    return DataDependentError(
        f"The traced code calls {call} on an array made from tensor data (tensor.numpy()).",
        "minihop traces NumPy calls on tensor data as torch ops through torch._numpy (as "
        "Dynamo does), which does not implement this one.",
        "Use the torch op instead, or run this Function eagerly: "
        "minihop.function(F, fallback=\"eager\").", where=where)


def _wrap(value: Any) -> Any:
    """``torch._numpy`` results as ``TracedArray`` (so NumPy's functions keep reaching them)."""
    if type(value) is tnp.ndarray:
        return TracedArray(value.tensor)
    if issubclass(type(value), tuple):
        return tuple(_wrap(v) for v in value)
    if issubclass(type(value), list):
        return [_wrap(v) for v in value]
    return value


def _numpy_name(func: Any) -> tuple[str, ...]:
    module = (getattr(func, "__module__", None) or "numpy").split(".")
    # numpy.linalg.norm -> ("linalg", "norm"); numpy.core.fromnumeric.sum -> ("sum",)
    sub = tuple(m for m in module[1:2] if m in ("linalg", "fft", "random"))
    return (*sub, func.__name__)


class TracedArray(tnp.ndarray):
    """A NumPy array over a fake tensor while tracing (see the module docstring)."""

    where: str | None = None

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        fn = getattr(tnp, ufunc.__name__, None)
        if method != "__call__" or fn is None:
            raise _refuse(f"numpy.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}"),
                          self.where)
        return _wrap(fn(*inputs, **kwargs))

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        path = _numpy_name(func)
        fn: Any = tnp
        for name in path:
            fn = getattr(fn, name, None)
            if fn is None:
                break
        if fn is None or path[0] == "random":
            raise _refuse("numpy." + ".".join(path), self.where)
        return _wrap(fn(*args, **kwargs))


def _method(name: str) -> Any:
    base = getattr(tnp.ndarray, name)

    def method(self: TracedArray, *args: Any, **kwargs: Any) -> Any:
        return _wrap(base(self, *args, **kwargs))

    method.__name__ = name
    return method


# The operators and methods of torch._numpy's ndarray return its own class: keep them traced.
for _name in [n for n in vars(tnp.ndarray) if callable(getattr(tnp.ndarray, n)) and n not in (
        "__init__", "__new__", "__getattribute__", "__setattr__", "__repr__", "__str__",
        "__bool__", "__int__", "__float__", "__index__", "__complex__", "__len__", "__iter__",
        "__reduce__", "__reduce_ex__", "__getstate__", "__dlpack__", "__dlpack_device__",
        "__hash__", "__array_ufunc__", "__array_function__", "__init_subclass__", "__class__",
        "__dir__", "__sizeof__", "__format__", "__contains__")]:
    setattr(TracedArray, _name, _method(_name))


def to_array(tensor: torch.Tensor, where: str | None) -> TracedArray:
    """``tensor.numpy()`` on a fake tensor: eager's error for one requiring grad under grad
    mode (forward runs under no_grad, so there eager allows it), else an array sharing its
    memory (as eager's does)."""
    if tensor.requires_grad and torch.is_grad_enabled():
        raise RuntimeError("Can't call numpy() on Tensor that requires grad. "
                           "Use tensor.detach().numpy() instead.")
    array = TracedArray(tensor)
    array.where = where
    return array


def from_array(array: Any) -> torch.Tensor | None:
    """``torch.from_numpy(array)``: the traced array's tensor; None for anything else."""
    return array.tensor if issubclass(type(array), tnp.ndarray) else None


_FROM_NUMPY = torch.from_numpy


def from_numpy(array: Any) -> torch.Tensor:
    """Stands in for ``torch.from_numpy`` while tracing (it is not a torch function a mode
    sees): a traced array gives its tensor, anything else goes to torch's."""
    tensor = from_array(array)
    return _FROM_NUMPY(array) if tensor is None else tensor
