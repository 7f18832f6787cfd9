"""A library's own code, run by the traced call, calling a name someone rebound after the capture
(``tracer.library_ran``), each against eager in strict, apply and fallback mode.

The user's code is analysed for what it reads; torch's is not followed. But which function a
library name is bound to when torch's code runs is anyone's to change: LoRA-style patches
(``nn.Linear.forward = lora_forward``), a helper method replaced (``nn.Conv1d._conv_forward``), a
functional rebound under a module (``F.gelu`` called by ``nn.GELU``, ``F.dropout`` by
``nn.Dropout``, ``torch.tanh`` by ``nn.Tanh`` in backward, ``nn.Module.__call__``). Each was
baked in at capture and silently kept (round 9 from outside); now each such name the call's
library code resolved is in the capture's record of names holding modules and library functions.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import minihop
from eager_modes import matches_eager


def x_(i: int) -> torch.Tensor:
    return (torch.linspace(-1, 1, 4) + i).requires_grad_()


@contextlib.contextmanager
def restored(owner, name):
    original = getattr(owner, name)
    try:
        yield original
    finally:
        setattr(owner, name, original)


def test_library_module_method_patched_after_capture():
    lin = nn.Linear(4, 4)

    class ThroughLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, m):
            return m(x)

        @staticmethod
        def backward(ctx, g):
            return g, None

    with restored(nn.Linear, "forward") as original:
        def lora_forward(self, x):
            return original(self, x) * 2

        def between(i):
            nn.Linear.forward = lora_forward if i >= 2 else original

        matches_eager(ThroughLinear, lambda i: (x_(i), lin), between=between,
                      reset=lambda: setattr(nn.Linear, "forward", original))


def test_library_helper_method_patched_after_capture():
    conv = nn.Conv1d(1, 1, 3, padding=1)

    class ThroughConv(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return conv(x.view(1, 1, 4)).view(4)

        @staticmethod
        def backward(ctx, g):
            return g

    with restored(nn.Conv1d, "_conv_forward") as original:
        def between(i):
            nn.Conv1d._conv_forward = (lambda self, x, w, b: original(self, x, w, b) * 2) if i % 2 else original

        matches_eager(ThroughConv, lambda i: (x_(i),), between=between,
                      reset=lambda: setattr(nn.Conv1d, "_conv_forward", original))


def test_an_alias_of_a_library_method_rebound():
    """``m(x)`` looks up ``Module.__call__``, which is ``Module._wrapped_call_impl`` under another
    name: each name that holds a function the call ran is read."""
    lin = nn.Linear(4, 4)

    class ThroughCall(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, m):
            return m(x)

        @staticmethod
        def backward(ctx, g):
            return g, None

    with restored(nn.Module, "__call__") as original:
        def between(i):
            nn.Module.__call__ = (lambda self, *a: original(self, *a) * 2) if i >= 2 else original

        matches_eager(ThroughCall, lambda i: (x_(i), lin), between=between,
                      reset=lambda: setattr(nn.Module, "__call__", original))


def test_functional_rebound_under_a_module():
    act = nn.GELU()

    class ThroughGelu(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return act(x)

        @staticmethod
        def backward(ctx, g):
            return g

    with restored(F, "gelu") as original:
        def between(i):
            F.gelu = (lambda x, approximate="none": original(x) * 2) if i >= 2 else original

        matches_eager(ThroughGelu, lambda i: (x_(i),), between=between, reset=lambda: setattr(F, "gelu", original))


def test_python_functional_rebound_under_a_module():
    drop = nn.Dropout(0.0)

    class ThroughDropout(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return drop(x)

        @staticmethod
        def backward(ctx, g):
            return g

    with restored(F, "dropout") as original:
        def between(i):
            F.dropout = (lambda x, p=0.5, training=True, inplace=False: x * 3) if i % 2 else original

        matches_eager(ThroughDropout, lambda i: (x_(i),), between=between,
                      reset=lambda: setattr(F, "dropout", original))


def test_library_code_in_backward_calls_a_function_rebound_before_backward():
    act = nn.Tanh()

    class TanhInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return act(g)

    with restored(torch, "tanh") as original:
        def mid(i):
            torch.tanh = torch.sigmoid if i >= 2 else original

        matches_eager(TanhInBackward, lambda i: (x_(i),), mid=mid,
                      reset=lambda: setattr(torch, "tanh", original))


def test_modules_stay_reusable_and_a_revert_hits_again():
    lin, act = nn.Linear(4, 4), nn.GELU()

    class Mlp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, m):
            return act(m(x))

        @staticmethod
        def backward(ctx, g):
            return g, None

    f = minihop.function(Mlp)
    x = x_(0)
    for _ in range(3):
        f(x, lin)
    assert f.stats.captures == 1 and f.stats.hits == 2
    with restored(nn.Linear, "forward") as original:
        nn.Linear.forward = lambda self, x: original(self, x) + 1
        assert torch.equal(f(x, lin), Mlp.apply(x, lin))
        assert f.stats.captures == 2
    assert torch.equal(f(x, lin), Mlp.apply(x, lin))
    assert f.stats.captures == 2, "the first capture serves again once the original is back"
    text = str(minihop.explain(Mlp, x, lin, print_report=False))
    assert "torch.nn.modules.linear:Linear.forward is" in text and "torch.nn.modules.activation:F.gelu is" in text


def test_the_mismatch_names_the_rebound_function():
    """A module argument's key holds its class's forward; a module reached otherwise is in the
    names record: either mismatch names the function, old and new, never a key tuple."""
    lin, held = nn.Linear(4, 4), nn.Linear(4, 4)

    class ThroughLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, m):
            return m(x) + held(x)

        @staticmethod
        def backward(ctx, g):
            return g, None

    x = x_(0)
    cap = minihop.capture(ThroughLinear, x, lin)
    with restored(nn.Linear, "forward") as original:
        def patched(self, x):
            return original(self, x)

        nn.Linear.forward = patched
        with pytest.raises(minihop.GuardMismatchError) as info:
            cap(x, lin)
        expected = ("argument 1 (m), submodule '(itself)', class's forward:\n"
                    "  captured: torch.nn.modules.linear.Linear.forward\n"
                    "  found:    test_library_rebound.test_the_mismatch_names_the_rebound_function.<locals>.patched")
        assert expected in str(info.value), str(info.value)
        failure = next(a for a in cap.assumptions if a.place == "names holding modules").explain_failure((x, lin))
        assert "torch.nn.modules.linear:Linear.forward holds another module (or value) than at capture" in str(failure)
        assert "('M'" not in str(info.value)


def test_a_module_run_in_forward_and_backward_reads_its_names_in_both():
    """``nn.Softsign`` runs in forward and again in backward: ``F.softsign`` rebound between them
    is what eager's backward calls (found by the reads generator, round 9)."""
    act = nn.Softsign()

    class Both(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * act(torch.ones(()))

        @staticmethod
        def backward(ctx, g):
            return g * act(torch.ones(()))

    with restored(F, "softsign") as original:
        def mid(i):
            F.softsign = torch.sin if i % 2 == 0 else original

        matches_eager(Both, lambda i: (x_(i),), mid=mid, reset=lambda: setattr(F, "softsign", original))


def test_a_library_class_forward_set_by_the_user_then_put_back():
    """The trace analyses the user's function set as ``nn.Hardshrink.forward``; put back, the
    library's runs again: the module's key holds its class's forward (found by the reads
    generator, round 9: the capture made with the user's was reused)."""
    shrink = nn.Hardshrink(0.5)

    class ThroughShrink(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * shrink(torch.ones(()))

        @staticmethod
        def backward(ctx, g):
            return g

    with restored(nn.Hardshrink, "forward") as original:
        def between(i):
            nn.Hardshrink.forward = original if i % 2 == 0 else (lambda self, t: t * 0.5)

        matches_eager(ThroughShrink, lambda i: (x_(i),), between=between,
                      reset=lambda: setattr(nn.Hardshrink, "forward", original))


def _global_hooks(register):
    """A hook for every module, registered by ``register(i)`` (None: none) before call ``i``;
    ``between(-1)`` removes it."""
    handles = []

    def between(i):
        for h in handles:
            h.remove()
        handles.clear()
        hook = register(i) if i >= 0 else None
        if hook is not None:
            handles.append(hook)

    return between


def test_a_module_built_inside_forward_runs_the_hooks_registered_for_every_module():
    """``nn.ReLU()(x)`` inside forward: its call runs the global hooks, registered between calls
    (an Open item of round 8: they were keyed only for the modules the code reads)."""
    class BuildsRelu(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return nn.ReLU()(x)

        @staticmethod
        def backward(ctx, g):
            return g

    between = _global_hooks(lambda i: nn.modules.module.register_module_forward_hook(
        lambda m, inp, out: out * 2) if i == 2 else None)
    try:
        matches_eager(BuildsRelu, lambda i: (x_(i),), between=between, reset=lambda: between(-1))
    finally:
        between(-1)


def test_a_helper_building_a_module_runs_a_global_pre_hook():
    def act(x):
        return nn.Tanh()(x)

    class ThroughHelper(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return act(x)

        @staticmethod
        def backward(ctx, g):
            return g

    between = _global_hooks(lambda i: nn.modules.module.register_module_forward_pre_hook(
        lambda m, inp: (inp[0] * 3,)) if i % 2 else None)
    try:
        matches_eager(ThroughHelper, lambda i: (x_(i),), between=between, reset=lambda: between(-1))
    finally:
        between(-1)


def test_a_global_hook_is_code_minihop_did_not_analyse():
    """A hook registered for every module runs where any module is called: the user's code,
    unanalysed, reading a value that changes between calls (single-use while it is registered)."""
    scale = [2.0]

    class BuildsRelu(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return nn.ReLU()(x)

        @staticmethod
        def backward(ctx, g):
            return g

    handle = nn.modules.module.register_module_forward_hook(lambda m, inp, out: out * scale[0])
    try:
        matches_eager(BuildsRelu, lambda i: (x_(i),), between=lambda i: scale.__setitem__(0, 2.0 + i),
                      reset=lambda: scale.__setitem__(0, 2.0))
    finally:
        handle.remove()
