"""A container or object argument kept on ctx, whose tensors backward reads, against eager.

``ctx.s = s`` in forward, ``ctx.s["w"]`` in backward: eager's backward reads the caller's
container when backward runs, so a tensor the caller put there between forward and
``.backward()`` is the one backward uses. Each script runs eagerly, through
``minihop.function`` (strict), ``minihop.apply`` and ``minihop.function(F,
fallback="eager")``, and compares outputs and every ``.grad``, call by call; the pair of every
strict capture is checked against the graph contract.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop

import eager_modes  # tests/ is on the path (pytest prepends a test file's directory)

MODES = eager_modes.MODES
_caller = eager_modes.caller
_same = eager_modes.same


def _check(fn: type, script: Callable[[Callable[..., Any]], list[Any]]) -> None:
    expected = script(_caller("eager", fn))
    for mode in MODES:
        minihop.reset()
        _same(expected, script(_caller(mode, fn)), mode)


class DictOnCtx(Function):
    @staticmethod
    def forward(ctx, x, params):
        ctx.params = params
        return x * params["w"]

    @staticmethod
    def backward(ctx, g):
        return g * ctx.params["w"] * 2, None


def test_a_dict_argument_on_ctx_whose_tensor_is_replaced_before_backward() -> None:
    def script(call: Callable[..., Any]) -> list[Any]:
        record = []
        for k in range(3):
            x = torch.arange(1.0, 4.0).requires_grad_()
            params = {"w": torch.full((3,), 2.0)}
            y = call(x, params)
            params["w"] = torch.full((3,), 7.0 + k)  # the caller's new weight, before backward
            y.sum().backward()
            record += [y.detach(), x.grad]
        return record

    _check(DictOnCtx, script)


def test_a_dict_argument_on_ctx_left_alone_is_reused() -> None:
    """The plain case still reuses one capture, and its pair keeps the contract."""
    def script(call: Callable[..., Any]) -> list[Any]:
        record = []
        params = {"w": torch.full((3,), 2.0)}
        for _ in range(3):
            x = torch.arange(1.0, 4.0).requires_grad_()
            y = call(x, params)
            y.sum().backward()
            record += [y.detach(), x.grad]
        return record

    _check(DictOnCtx, script)
    minihop.reset()
    f = minihop.function(DictOnCtx)
    script(f)
    assert minihop.counters()["captures"] == 1
    cap = minihop.capture(DictOnCtx, torch.ones(3, requires_grad=True), {"w": torch.ones(3)})
    minihop.check_consistent(cap.fwd, cap.bwd)


def test_the_tensor_written_in_place_before_backward() -> None:
    def script(call: Callable[..., Any]) -> list[Any]:
        record = []
        for k in range(2):
            x = torch.arange(1.0, 4.0).requires_grad_()
            params = {"w": torch.full((3,), 2.0)}
            y = call(x, params)
            params["w"].mul_(3.0 + k)
            y.sum().backward()
            record += [y.detach(), x.grad]
        return record

    _check(DictOnCtx, script)


@dataclasses.dataclass
class Config:
    scale: torch.Tensor
    bias: torch.Tensor


class ObjectOnCtx(Function):
    """A config object kept whole on ctx (the way a layer passes ``self.cfg``)."""

    @staticmethod
    def forward(ctx, x, cfg):
        ctx.cfg = cfg
        return x * cfg.scale + cfg.bias

    @staticmethod
    def backward(ctx, g):
        return g * ctx.cfg.scale + ctx.cfg.bias.sum(), None


def test_an_object_argument_on_ctx_whose_attribute_is_replaced() -> None:
    def script(call: Callable[..., Any]) -> list[Any]:
        record = []
        for k in range(3):
            x = torch.arange(1.0, 4.0).requires_grad_()
            cfg = Config(torch.full((3,), 2.0), torch.zeros(3))
            y = call(x, cfg)
            cfg.scale = torch.full((3,), -1.0 - k)
            if k == 1:
                cfg.bias = torch.ones(3)
            y.sum().backward()
            record += [y.detach(), x.grad]
        return record

    _check(ObjectOnCtx, script)


class NestedOnCtx(Function):
    """Only a part of an argument is kept: ``ctx.inner = opts["inner"]``, and a list in a tuple."""

    @staticmethod
    def forward(ctx, x, opts, ws):
        ctx.inner = opts["inner"]
        ctx.pair = (ws, 2)
        return x * opts["inner"].w + ws[0]

    @staticmethod
    def backward(ctx, g):
        ws, k = ctx.pair
        return g * ctx.inner.w * k + ws[-1], None, None


def test_a_part_of_an_argument_on_ctx_and_a_list_inside_a_tuple() -> None:
    class Inner:
        def __init__(self, w: torch.Tensor) -> None:
            self.w = w

    def script(call: Callable[..., Any]) -> list[Any]:
        record = []
        for k in range(3):
            x = torch.arange(1.0, 4.0).requires_grad_()
            opts = {"inner": Inner(torch.full((3,), 2.0))}
            ws = [torch.full((3,), 1.0)]
            y = call(x, opts, ws)
            opts["inner"].w = torch.full((3,), 5.0 + k)
            ws[0] = torch.full((3,), 10.0 * k)
            y.sum().backward()
            record += [y.detach(), x.grad]
        return record

    _check(NestedOnCtx, script)


def test_a_replaced_tensor_of_another_shape_traces_backward_again() -> None:
    """The new tensor broadcasts: eager's gradient has x's shape either way."""
    def script(call: Callable[..., Any]) -> list[Any]:
        record = []
        for k in range(3):
            x = torch.arange(1.0, 4.0).requires_grad_()
            params = {"w": torch.full((3,), 2.0)}
            y = call(x, params)
            params["w"] = torch.full((1,), 4.0 + k) if k else torch.full((3,), 3.0)
            y.sum().backward()
            record += [y.detach(), x.grad]
        return record

    _check(DictOnCtx, script)


KEY = "w"


class KeyFromGlobal(Function):
    @staticmethod
    def forward(ctx, x, params):
        ctx.params = params
        return x * params["w"]

    @staticmethod
    def backward(ctx, g):
        return g * ctx.params[KEY], None


@pytest.fixture
def key_reset() -> Any:
    global KEY
    yield
    KEY = "w"


def test_backward_reads_another_key_when_a_global_changes(key_reset: Any) -> None:
    """The second call's backward takes a path the captured one did not: forward passed every
    tensor of the container on ctx, so backward traced again finds it."""
    def script(call: Callable[..., Any]) -> list[Any]:
        global KEY
        record = []
        for k in range(3):
            KEY = "w"
            x = torch.arange(1.0, 4.0).requires_grad_()
            params = {"w": torch.full((3,), 2.0), "v": torch.full((3,), 3.0)}
            y = call(x, params)
            KEY = "v" if k == 1 else "w"
            params["v"] = torch.full((3,), 9.0 + k)
            y.sum().backward()
            record += [y.detach(), x.grad]
        return record

    _check(KeyFromGlobal, script)


class WritesBack(Function):
    """Backward writes into the container it kept (a step counter the caller reads)."""

    @staticmethod
    def forward(ctx, x, state):
        ctx.state = state
        return x * state["w"]

    @staticmethod
    def backward(ctx, g):
        ctx.state["steps"] = ctx.state.get("steps", 0) + 1
        return g * ctx.state["w"], None


def test_backward_writes_into_the_container_it_kept() -> None:
    def script(call: Callable[..., Any]) -> list[Any]:
        record = []
        state = {"w": torch.full((3,), 2.0)}
        for k in range(3):
            x = torch.arange(1.0, 4.0).requires_grad_()
            y = call(x, state)
            state["w"] = torch.full((3,), 1.0 + k)
            y.sum().backward()
            record += [y.detach(), x.grad, state.get("steps")]
        return record

    _check(WritesBack, script)


MODE = "short"


class FlagInBackward(Function):
    """Backward's path depends on a module-level flag the caller flips before ``.backward()``
    (a debug switch): the other path reads forward values the first did not."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        ctx.s = x.sin()
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        if MODE == "short":
            return g * 2
        return g * x * ctx.s


@pytest.fixture
def mode_reset() -> Any:
    global MODE
    yield
    MODE = "short"


def test_a_flag_flipped_before_backward_needs_forward_values_the_capture_did_not_use(mode_reset: Any) -> None:
    def script(call: Callable[..., Any]) -> list[Any]:
        global MODE
        record = []
        for k in range(3):
            MODE = "short"
            x = torch.arange(1.0, 4.0).requires_grad_()
            y = call(x)
            if k == 1:
                MODE = "long"
            y.sum().backward()
            record += [y.detach(), x.grad]
        return record

    _check(FlagInBackward, script)


class WritesThenReads(Function):
    """Forward leaves its output in the caller's dict (a last-activation cache) and keeps the
    dict; backward reads both the weight and what forward left."""

    @staticmethod
    def forward(ctx, x, state):
        y = x * state["w"]
        state["last"] = y.detach()
        ctx.state = state
        return y

    @staticmethod
    def backward(ctx, g):
        return g * ctx.state["w"] + ctx.state["last"], None


@pytest.mark.parametrize("replace_last", [False, True], ids=["kept", "replaced by the caller"])
def test_backward_reads_what_forward_left_in_an_argument_container(replace_last: bool) -> None:
    def script(call: Callable[..., Any]) -> list[Any]:
        record = []
        for k, n in enumerate((3, 3, 4)):
            x = torch.linspace(1.0, 2.0, n).requires_grad_()
            state = {"w": torch.full((n,), 2.0 + k)}
            y = call(x, state)
            record.append(state["last"])
            state["w"] = torch.full((n,), 7.0 + k)
            if replace_last:
                state["last"] = torch.full((n,), -1.0 - k)
            y.sum().backward()
            record += [y.detach(), x.grad]
        return record

    _check(WritesThenReads, script)


def test_a_dict_argument_holding_the_tensor_argument_itself() -> None:
    """``{"w": x}`` passed next to ``x``: the dict's entry is the caller's to replace."""
    def script(call: Callable[..., Any]) -> list[Any]:
        record = []
        for k in range(3):
            x = torch.linspace(1.0, 2.0, 3).requires_grad_()
            params = {"w": x}
            y = call(x, params)
            params["w"] = torch.full((3,), 7.0 + k)
            y.sum().backward()
            record += [y.detach(), x.grad]
        return record

    _check(DictOnCtx, script)


class SetupContextStyle(Function):
    """The setup_context form (what torch.func needs): ctx keeps ``inputs[1]``."""

    @staticmethod
    def forward(x, params):
        return x * params["w"]

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.params = inputs[1]

    @staticmethod
    def backward(ctx, g):
        return g * ctx.params["w"], None


def test_setup_context_keeps_the_argument_container() -> None:
    def script(call: Callable[..., Any]) -> list[Any]:
        record = []
        for k, n in enumerate((3, 4, 5)):
            x = torch.linspace(1.0, 2.0, n).requires_grad_()
            params = {"w": torch.full((n,), 2.0)}
            y = call(x, params)
            params["w"] = torch.full((n,), 7.0 + k)
            y.sum().backward()
            record += [y.detach(), x.grad]
        return record

    _check(SetupContextStyle, script)
