"""``minihop.explain`` (``minihop/explain.py``): the report of how a capture handled a Function.

The report is for people, so these tests pin key words (the feature names, "captured",
"specialised", the error code, each argument's name) rather than whole lines.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop


def r(*shape: int, grad: bool = True) -> torch.Tensor:
    """A random float32 leaf."""
    return torch.randn(*shape).requires_grad_(grad)


class Features(Function):
    """Uses save_for_backward, a ctx attribute, needs_input_grad, mark_non_differentiable and
    set_materialize_grads(False)."""

    @staticmethod
    def forward(ctx, x, y, k):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        ctx.k = k
        positive = x > 0
        ctx.mark_non_differentiable(positive)
        return x * y * k, positive

    @staticmethod
    def backward(ctx, g, _g_positive):
        if g is None:
            return None, None, None
        (x,) = ctx.saved_tensors
        gy = g * x * ctx.k if ctx.needs_input_grad[1] else None
        return g * ctx.k, gy, None


_GLOBAL_W = torch.full((3,), 2.0)


def make_live() -> type:
    """A Function reading a closure tensor and a global tensor."""
    cell = torch.full((3,), 3.0)

    class Live(Function):
        @staticmethod
        def forward(ctx, x):
            return x * cell * _GLOBAL_W

        @staticmethod
        def backward(ctx, g):
            return g * cell * _GLOBAL_W

    return Live


class Item(Function):
    @staticmethod
    def forward(ctx, x):
        return x * torch.rand((), generator=torch.Generator().manual_seed(0)).item()  # random: not known at capture

    @staticmethod
    def backward(ctx, g):
        return g


class SaveSum(Function):
    @staticmethod
    def forward(ctx, x):
        s = x.sum(0)
        ctx.save_for_backward(s)
        return x * s

    @staticmethod
    def backward(ctx, g):
        (s,) = ctx.saved_tensors
        return g * s


def feature_map(report: minihop.Explanation) -> dict[str, str]:
    return dict(report.features)


def check_result(fn_cls: type, *args: Any) -> None:
    """The Function explained also runs through minihop.function with eager's result."""
    torch.testing.assert_close(minihop.function(fn_cls).apply(*args), fn_cls.apply(*args))


# ---------------------------------------------------------------------------------------------
# minihop.explain on a captured Function
# ---------------------------------------------------------------------------------------------

class TestExplainCaptured:
    def test_features_and_handling(self) -> None:
        """Each ctx feature used is listed with its handling: captured or specialised."""
        args = (r(3), r(3), 2.0)
        report = minihop.explain(Features, *args, print_report=False)
        assert report.captured and report.error is None and report.function == "Features"
        features = feature_map(report)
        expected = {
            "save_for_backward": "captured",
            "saved_tensors": "captured",
            "mark_non_differentiable": "captured",
            "ctx.k (float)": "specialised",
            "needs_input_grad": "specialised",
            "set_materialize_grads(False)": "specialised",
        }
        for name, handling in expected.items():
            assert name in features, f"{name} missing from {sorted(features)}"
            assert features[name].startswith(handling + ":"), (name, features[name])
        text = str(report)
        assert "ctx features:" in text
        for name, how in report.features:
            assert f"    {name}: {how}" in text
        assert report.saved == 1 and report.fwd_ops > 0 and report.bwd_ops > 0
        out, positive = minihop.function(Features).apply(*args)
        out_e, positive_e = Features.apply(*args)
        torch.testing.assert_close(out, out_e)
        assert torch.equal(positive, positive_e)

    def test_ctx_tensor_attribute(self) -> None:
        """A tensor stored on ctx is listed as captured."""

        class CtxTensor(Function):
            @staticmethod
            def forward(ctx, x):
                ctx.doubled = x * 2
                return x.sin()

            @staticmethod
            def backward(ctx, g):
                return g * ctx.doubled

        report = minihop.explain(CtxTensor, r(3), print_report=False)
        assert feature_map(report)["ctx.doubled (tensor)"].startswith("captured:")
        check_result(CtxTensor, r(3))

    def test_no_features(self) -> None:
        """A Function using no ctx feature says so."""

        class Plain(Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, g):
                return g * 2

        report = minihop.explain(Plain, r(3), print_report=False)
        assert report.features == ()
        assert "(none)" in str(report)

    def test_guards_per_argument(self) -> None:
        """Guards name grad mode, autocast and every argument: tensors with shape, dtype, device, requires_grad; values."""
        report = minihop.explain(Features, r(3), r(3, grad=False), 2.0, print_report=False)
        assert report.guards[0] == "grad mode enabled == True"
        assert report.guards[1] == "autocast == off"
        # Guards on Python values outside the arguments (torch.distributed's process group,
        # guarded for every capture) follow the arguments'.
        # (Then the number of arguments and the mark_dynamic rule, lines without a colon.)
        by_arg = {g.split(":", 1)[0]: g for g in report.guards[2:] if ":" in g and not g.startswith("Python value")}
        assert set(by_arg) == {"x", "y", "k"}
        assert "number of arguments == 3" in report.guards
        for name, grad in (("x", True), ("y", False)):
            assert "[3]" in by_arg[name] and "torch.float32" in by_arg[name]
            assert "cpu" in by_arg[name] and f"requires_grad={grad}" in by_arg[name]
        assert "2.0" in by_arg["k"]
        text = str(report)
        for guard in report.guards:
            assert guard in text

    def test_grad_mode_guard(self) -> None:
        """Explained under torch.no_grad(), the grad-mode guard says False."""
        with torch.no_grad():
            report = minihop.explain(Features, r(3), r(3), 2.0, print_report=False)
        assert report.guards[0] == "grad mode enabled == False"

    def test_autocast_guard(self) -> None:
        """Explained under torch.autocast, the autocast guard names the device and dtype."""
        with torch.autocast("cpu", dtype=torch.bfloat16):
            report = minihop.explain(Features, r(3), r(3), 2.0, print_report=False)
        assert report.guards[1] == "autocast == cpu torch.bfloat16 (cache on)"

    def test_live_inputs(self) -> None:
        """Tensors read from a closure and a global are listed as fwd inputs and guarded; backward's
        reads of them are inputs of their own, fetched again when backward runs."""
        live = make_live()
        report = minihop.explain(live, r(3), print_report=False)
        assert len(report.fwd_inputs) == 5
        assert [s.split(" <- ")[0] for s in report.fwd_inputs[3:]] == ["l_cell_bwd", "g__GLOBAL_W_bwd"]
        assert all("backward reads when it runs" in s for s in report.fwd_inputs[3:])
        assert report.fwd_inputs[0].endswith("<- x")
        lifted = report.fwd_inputs[1:]
        assert any("cell" in s for s in lifted) and any("_GLOBAL_W" in s for s in lifted), lifted
        live_guards = [g for g in report.guards if "read anew each call" in g]
        assert len(live_guards) == 2  # backward's reads are checked when backward runs:
        assert len([g for g in report.guards if "fetched when backward runs" in g]) == 2
        assert any("cell" in g for g in live_guards) and any("_GLOBAL_W" in g for g in live_guards)
        check_result(live, r(3))

    def test_dynamic_shape_guards(self) -> None:
        """With dynamic=True, tensor guards leave sizes open and the shape guards are listed."""
        report = minihop.explain(Features, r(3), r(3), 2.0, dynamic=True, print_report=False)
        assert report.captured
        by_arg = {g.split(":", 1)[0]: g for g in report.guards[1:]}
        assert "[*]" in by_arg["x"] and "[*]" in by_arg["y"]
        [shape_guard] = [g for g in report.guards if g.startswith("dynamic sizes: ")]
        assert "T[0].size()[0]" in shape_guard and "T[1].size()[0]" in shape_guard
        static = minihop.explain(Features, r(3), r(3), 2.0, print_report=False)
        assert not any(g.startswith("dynamic sizes") for g in static.guards)

    def test_saved_sizes_and_graphs(self) -> None:
        """The report shows each saved value with its size, and the graphs (issue 4, Observability)."""
        x = r(2, 7)
        report = minihop.explain(SaveSum, x, print_report=False)
        text = str(report)
        assert report.saved == 1
        assert "[7]" in text or "(7,)" in text, text  # the saved x.sum(0)
        assert "fwd_body_0" in text and "bwd_body_0" in text, text
        check_result(SaveSum, x)


# ---------------------------------------------------------------------------------------------
# minihop.explain on a refused Function
# ---------------------------------------------------------------------------------------------

class TestExplainRefused:
    def test_refused(self) -> None:
        """A refused Function is reported as not captured, with the error's code and message."""
        report = minihop.explain(Item, r(3), print_report=False)
        assert report.captured is False
        assert report.error is not None and report.error.startswith("[MH103] Item.forward calls item")
        text = str(report)
        assert "captured: no" in text and "[MH103]" in text
        assert report.features == () and report.guards == ()

    def test_refused_does_not_raise(self) -> None:
        """explain never raises a MinihopError: the refusal is the report."""
        with pytest.raises(minihop.DataDependentError):
            minihop.capture(Item, r(3))
        assert not minihop.explain(Item, r(3), print_report=False).captured


# ---------------------------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------------------------

class TestPrinting:
    def test_print_report_false(self, capsys: pytest.CaptureFixture[str]) -> None:
        """print_report=False prints nothing."""
        minihop.explain(Features, r(3), r(3), 2.0, print_report=False)
        minihop.explain(Item, r(3), print_report=False)
        assert capsys.readouterr().out == ""

    def test_prints_by_default(self, capsys: pytest.CaptureFixture[str]) -> None:
        """By default the report is printed, exactly as str() gives it."""
        report = minihop.explain(Features, r(3), r(3), 2.0)
        out = capsys.readouterr().out
        assert out == str(report) + "\n"
        assert out.startswith("minihop.explain: Features\n  captured: yes\n")

    def test_prints_refusal(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A refusal is printed too, with its code."""
        minihop.explain(Item, r(3))
        out = capsys.readouterr().out
        assert "captured: no" in out and "[MH103]" in out
