"""The calls the recording mode handles itself, as a table of handlers.

Place in the pipeline: tracer, read by ``recorder.RecordingMode.__torch_function__`` before it
runs a call (``special_call(func)``). Each handler is ``(mode, recorder, func, args, kwargs) ->
result`` and replaces running and recording the call the ordinary way, or answers
``NOT_SPECIAL`` to let it run and be recorded as usual. The rows, by how a call is known:

- ``BEFORE_RUN`` (by identity): autocast's switches become graph nodes, the user's own
  grad-mode switches are recorded where they switch, ``backward()`` is recorded as a grad node
  and a ``.grad`` accumulation (``recompute``), ``torch.from_numpy``/``torch.as_tensor`` of an
  array tracing made give its tensor (``numpy_bridge``);
- ``BY_NAME`` (by ``__name__``, every spelling of a method): ``tensor.numpy()`` on a fake tensor
  gives a traced array (``numpy_bridge``);
- ``BY_KIND`` (by a test on the callable): ``torch.distributed``'s collectives are written as
  their functional collectives or refused (``collectives``).

The other calls special to the recorder are keyed by name (``VALUE_READS``, here: values
read out of tensors) or are ``Tensor.__setitem__`` (recorded as ``operator.setitem`` after it
runs, since it returns None). A new special call is a handler and a row here.

Invariant: a call matches at most one row (identity first, then name, then kind), and what a
row does not handle runs exactly as an ordinary call.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.amp.autocast_mode import _enter_autocast, _exit_autocast

from torch._subclasses.fake_tensor import FakeTensor

from . import collectives, grad_modes, numpy_bridge, recompute

# The handlers' ``mode`` is a ``recorder.RecordingMode`` and ``recorder`` its ``GraphRecorder``
# (typed Any: recorder imports this module).
RecordingMode = GraphRecorder = Any

__all__ = ["AUTOCAST_SWITCHES", "BEFORE_RUN", "BY_KIND", "BY_NAME", "COPY_READS", "NOT_SPECIAL", "SCALAR_READS",
           "VALUE_READS", "special_call"]

# Calls that take values out of a tensor into Python; a fake tensor has none to give.
VALUE_READS = frozenset({"numpy", "tolist", "item", "__bool__", "__int__", "__float__",
                         "__index__", "__complex__", "__array__",
                         # CPU methods that run a Python callable on each value, and DLPack's
                         # export of the data (on a fake tensor's missing data they crash).
                         "apply_", "map_", "map2_", "__dlpack__",
                         # torch.save, pickle and copy.deepcopy copy the values too.
                         "__reduce_ex__", "__reduce__", "__deepcopy__", "__getstate__"})
# Value reads that give unbacked symbols when the tensor depends on the call (see unbacked).
SCALAR_READS = frozenset({"item", "tolist"})
# Value reads whose result leaves torch (an array, a pickle): refused, never answered.
COPY_READS = frozenset({"numpy", "__array__", "__reduce_ex__", "__reduce__", "__deepcopy__",
                        "__getstate__", "apply_", "map_", "map2_", "__dlpack__"})

# A handler's answer for a call it leaves alone: run and record it the ordinary way.
NOT_SPECIAL: Any = object()


def _enter_autocast_node(mode: RecordingMode, recorder: GraphRecorder, func: Any,
                         args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    # Called by autocast.__enter__ after it switched autocast (the fake ops that follow see
    # the switch); the node makes the graph switch it the same way.
    mode.autocast_nodes.append(recorder.record(func, args, kwargs, None))


def _exit_autocast_node(mode: RecordingMode, recorder: GraphRecorder, func: Any,
                        args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    recorder.record(func, (mode.autocast_nodes.pop(),), {}, None)


def _backward(mode: RecordingMode, recorder: GraphRecorder, func: Any,
              args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # Checkpoint-style backwards: a grad node and a .grad accumulation (see recompute).
    return recompute.backward(recorder, func, args, kwargs, mode.describe(), mode.where(),
                              getattr(mode, "sources", {}))


def _from_array(mode: RecordingMode, recorder: GraphRecorder, func: Any,
                args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # An array tracing made from tensor data (``numpy_bridge``) gives its tensor back; any
    # other array is the user's constant, made into a tensor as usual.
    tensor = numpy_bridge.from_array(args[0]) if args else None
    return NOT_SPECIAL if tensor is None else tensor


def _to_array(mode: RecordingMode, recorder: GraphRecorder, func: Any,
              args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # ``tensor.numpy()`` on a fake tensor: a traced array over it (``numpy_bridge``).
    if args and issubclass(type(args[0]), FakeTensor):
        return numpy_bridge.to_array(args[0], mode.where())
    return NOT_SPECIAL


def _collective(mode: RecordingMode, recorder: GraphRecorder, func: Any,
                args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # Written as its functional collective (or refused): run on fake tensors it would
    # communicate nothing and leave no node.
    return collectives.record(mode, func, args, kwargs, mode.describe(), mode.where())


AUTOCAST_SWITCHES = (_enter_autocast_node, _exit_autocast_node)  # outside a recording: nothing
BEFORE_RUN: dict[Any, Any] = {
    _enter_autocast: _enter_autocast_node,
    _exit_autocast: _exit_autocast_node,
    # The user's own enable_grad()/no_grad(): as eager's in either backward mode (grad_modes).
    torch._C._set_grad_enabled: grad_modes.switch,
    torch.Tensor.backward: _backward,
    torch.autograd.backward: _backward,
    torch.from_numpy: _from_array,
    torch.as_tensor: _from_array,
}
BY_NAME: dict[str, Any] = {
    "numpy": _to_array,
}
BY_KIND: tuple[tuple[Any, Any], ...] = (
    (collectives.is_collective, _collective),
)


def special_call(func: Any) -> Any:
    """The handler of the row ``func`` matches, or None for an ordinary call."""
    try:
        handler = BEFORE_RUN.get(func)
    except TypeError:  # an unhashable callable: in no identity row
        handler = None
    if handler is None:
        name = getattr(func, "__name__", None)
        handler = BY_NAME.get(name) if type(name) is str else None
        if handler is None:
            for matches, kind_handler in BY_KIND:
                if matches(func):
                    return kind_handler
    return handler
