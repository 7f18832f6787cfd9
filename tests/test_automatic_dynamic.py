"""Automatic dynamic shapes and Dynamo's dimension marks, against eager PyTorch.

``minihop.apply`` / ``minihop.function`` / ``@captured`` default to ``dynamic=None``: the first
call is captured static; a later call whose tensor has a size unlike one seen before makes
that dimension symbolic (as ``torch.compile``'s automatic dynamic shapes), and that capture
serves every size its guards admit. Sizes 0 and 1 are specialised (a capture of their own).
An int argument that changes becomes a SymInt the same way.
``torch._dynamo.mark_dynamic`` / ``maybe_mark_dynamic`` / ``mark_static`` marks are read from
the tensors. Every call is compared with eager ``F.apply`` (outputs and every ``.grad``,
exactly); the graphs for marked inputs are compared with ``torch.compile``'s.
"""

from __future__ import annotations

import collections
import copy
import math
import warnings
from typing import Any

import pytest
import torch
import torch.fx as fx
from torch.autograd import Function

import minihop
from minihop.testing import _op_name, clone_args
from shared_functions import Add, MatMul, MeanRows, MySin


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def r(*shape: int, grad: bool = True) -> torch.Tensor:
    return torch.randn(*shape).requires_grad_(grad)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    torch.manual_seed(0)
    minihop.reset()


def exact(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=0, msg=lambda s: f"{what}: {s}")


def assert_step_matches_eager(run: Any, fn_cls: type, *args: Any) -> Any:
    """One fwd+bwd step through ``run`` and through eager ``fn_cls.apply`` on clones of
    ``args``: outputs and every ``.grad`` equal, bit for bit."""
    eager_args, mine_args = clone_args(args), clone_args(args)
    for a, m in zip(args, mine_args, strict=True):
        if isinstance(a, torch.Tensor):
            copy_marks(a, m)
    eager, mine = fn_cls.apply(*eager_args), run(*mine_args)
    eager = eager if isinstance(eager, tuple) else (eager,)
    mine = mine if isinstance(mine, tuple) else (mine,)
    for i, (e, m) in enumerate(zip(eager, mine, strict=True)):
        exact(m, e, f"output {i}")
        assert m.requires_grad == e.requires_grad
    gen = torch.Generator().manual_seed(1)
    weights = [torch.randn(e.shape, generator=gen) for e in eager]
    sum((e * w).sum() for e, w in zip(eager, weights, strict=True)).backward()
    sum((m * w).sum() for m, w in zip(mine, weights, strict=True)).backward()
    for i, (e, m) in enumerate(zip(eager_args, mine_args, strict=True)):
        if isinstance(e, torch.Tensor) and e.requires_grad:
            exact(m.grad, e.grad, f"grad of argument {i}")
    return mine


def copy_marks(source: torch.Tensor, target: torch.Tensor) -> None:
    """The attributes torch._dynamo's mark functions set, copied onto a clone."""
    for attr in ("_dynamo_dynamic_indices", "_dynamo_weak_dynamic_indices", "_dynamo_static_indices",
                 "_has_dynamo_dim_marking"):
        if hasattr(source, attr):
            setattr(target, attr, copy.copy(getattr(source, attr)))


def sym_placeholders(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.SymInt)]


def marked(t: torch.Tensor, how: Any, dims: Any) -> torch.Tensor:
    how(t, dims)
    return t


# ---------------------------------------------------------------------------------------------
# Functions, each using sizes differently
# ---------------------------------------------------------------------------------------------


class Linear(Function):
    """A small MLP layer: x @ w.t() + b."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return x @ w.t() + b

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, g.t() @ x, g.sum(0)



class Flatten(Function):
    """``view(s0, -1)`` in forward, the size saved and ``view(n, 3, 2)`` back in backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.n = x.shape[0]
        return x.view(x.shape[0], -1) * 2

    @staticmethod
    def backward(ctx, g):
        return g.view(ctx.n, 3, 2) * 2


class SplitFirst(Function):
    """Split sizes computed from the input's size, saved for backward."""

    @staticmethod
    def forward(ctx, x):
        n = x.shape[0]
        a, b = x.split([1, n - 1])
        ctx.sizes = (1, n - 1)
        return a.sum() + b.sum() * 2

    @staticmethod
    def backward(ctx, g):
        return torch.cat([g.expand(ctx.sizes[0], 4), (g * 2).expand(ctx.sizes[1], 4)])


class NewZeros(Function):
    """A new tensor sized by the input (``new_zeros(s0, 2)``) in forward and in backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.n = x.shape[0]
        return x.new_zeros(x.shape[0], 2) + x[:, :2]

    @staticmethod
    def backward(ctx, g):
        return torch.cat([g, g.new_zeros(ctx.n, 2)], 1)



class Branchy(Function):
    """Python control flow on a size: the trace guards ``s0 > 4``."""

    @staticmethod
    def forward(ctx, x):
        return x * 2 if x.shape[0] > 4 else x * 3

    @staticmethod
    def backward(ctx, g):
        return g * 2 if g.shape[0] > 4 else g * 3


class Pinned(Function):
    """Specialises its size: ``x.shape[0] == 5`` fixes it to 5 on the way taken."""

    @staticmethod
    def forward(ctx, x):
        return x * 2 if x.shape[0] == 5 else x * 3

    @staticmethod
    def backward(ctx, g):
        return g * 2 if g.shape[0] == 5 else g * 3


class Unbiased(Function):
    """A float made from sizes reaching an op: refused with symbolic sizes, fine static."""

    @staticmethod
    def forward(ctx, x):
        n = x.shape[0]
        return x * (n / (n - 1))

    @staticmethod
    def backward(ctx, g):
        n = g.shape[0]
        return g * (n / (n - 1))


class Scale(Function):
    """An int argument (a constant in the graph, then a SymInt once it changes)."""

    @staticmethod
    def forward(ctx, x, k):
        ctx.k = k
        return x * k

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k, None


INT_USES: dict[str, Any] = {
    "sum over dim k % 2": lambda x, k: x.sum(k % 2),
    "torch.full((k,))": lambda x, k: x.sum() * torch.full((k,), 1.5).sum(),
    "[1] * k": lambda x, k: x * len([1] * k),
    "x[:, k % 3]": lambda x, k: x[:, k % 3] * 2,
    "reshape(k, -1)": lambda x, k: x.reshape(k, -1).sum(0),
    "arange(k)": lambda x, k: x.sum() * torch.arange(k).sum(),
    "roll(k)": lambda x, k: x.roll(k),
    "k == 2 branch": lambda x, k: x * 2 if k == 2 else x * 3,
    "k % 3": lambda x, k: x * (k % 3),
    "str(k)": lambda x, k: x * len(str(k)),
    "f-string": lambda x, k: x * len(f"{k}{k}"),
    "dict key": lambda x, k: x * {k: 2}.get(k, 1),
    "pow(k)": lambda x, k: x.pow(k),
    "math.sqrt(k)": lambda x, k: x * math.sqrt(k),
    "torch.tensor(k)": lambda x, k: x * torch.tensor(k),
    "float(k)": lambda x, k: x * float(k),
    "x / k": lambda x, k: x / k,
    "k // 2": lambda x, k: x * (k // 2),
    "narrow": lambda x, k: x.narrow(0, 0, k % 2 + 1),
    "expand(k, -1)": lambda x, k: x[:1].expand(k, -1),
    "new_zeros(k)": lambda x, k: x.new_zeros(k) + x.sum(),
    "topk": lambda x, k: x.flatten().topk(k % 3 + 1).values,
    "repeat(k, 1)": lambda x, k: x.repeat(k, 1),
}


def int_user(use: Any) -> type:
    """A Function computing ``use(x, k)``, k kept on ctx; backward differentiates it again."""
    class UsesInt(Function):
        @staticmethod
        def forward(ctx, x, k):
            ctx.save_for_backward(x)
            ctx.k = k
            return use(x, k)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            with torch.enable_grad():
                leaf = x.detach().requires_grad_()
                out = use(leaf, ctx.k)
            return torch.autograd.grad(out, leaf, g)[0], None

    return UsesInt


# ---------------------------------------------------------------------------------------------
# The automatic policy
# ---------------------------------------------------------------------------------------------

SIZES = (8, 9, 3, 17, 2, 31, 5, 12, 7, 64, 6, 10, 4, 23, 15, 11, 33, 13, 16, 40)


class TestAutomaticDynamic:
    def test_twenty_sizes_two_captures(self) -> None:
        """MySin at 20 batch sizes through minihop.apply: eager's outputs and grads at each, 2 captures, 18 hits."""
        for n in SIZES:
            assert_step_matches_eager(lambda x: minihop.apply(MySin, x), MySin, r(n, 8))
        assert minihop.counters() == {"captures": 2, "cache_hits": 18, "fallbacks": 0, "internal_errors": 0}
        stats = MySin._minihop_default.stats
        assert (stats.captures, stats.hits, stats.evictions) == (2, 18, 0)

    def test_mlp_layer_twenty_sizes(self) -> None:
        """A Linear Function with fixed weights at 20 batch sizes: only the batch dimension becomes symbolic."""
        cf = minihop.function(Linear)
        w, b = r(5, 8), r(5)
        for n in SIZES:
            assert_step_matches_eager(cf.apply, Linear, r(n, 8), w, b)
        assert cf.stats.captures == 2
        static, dynamic = cf.captures
        assert sym_placeholders(static.fwd) == []
        assert len(sym_placeholders(dynamic.fwd)) == 1
        vals = {n.name: n.meta["val"] for n in dynamic.fwd.graph.nodes if n.op == "placeholder"}
        x_val, w_val = vals["l_x_"], vals["l_w_"]
        assert isinstance(x_val.shape[0], torch.SymInt) and x_val.shape[1] == 8
        assert all(type(s) is int for s in w_val.shape)

    def test_first_call_is_static(self) -> None:
        """One call captures static; a second size makes only the dimension that changed symbolic."""
        cf = minihop.function(MySin)
        assert_step_matches_eager(cf.apply, MySin, r(4, 3))
        (first,) = cf.captures
        assert first.shape_guards is None and sym_placeholders(first.fwd) == []
        assert_step_matches_eager(cf.apply, MySin, r(6, 3))
        second = cf.captures[1]
        assert second.dynamic_dims == {0: (0,)}
        assert_step_matches_eager(cf.apply, MySin, r(6, 5))  # now dimension 1 changes too
        assert cf.captures[2].dynamic_dims == {0: (0, 1)}
        assert cf.stats.captures == 3

    def test_sizes_zero_and_one_specialise(self) -> None:
        """Sizes 0 and 1 of a symbolic dimension get a static capture each (as Dynamo's 0/1 specialisation), then hit."""
        cf = minihop.function(MySin)
        for n in (8, 9, 1, 0, 1, 0, 5):
            assert_step_matches_eager(cf.apply, MySin, r(n, 3))
        assert cf.stats.captures == 4 and cf.stats.hits == 3
        guards = sorted(c.shape_guards.expression for c in cf.captures if c.shape_guards is not None)
        assert guards == ["2 <= T[0].size()[0]", "T[0].size()[0] == 0", "T[0].size()[0] == 1"]

    def test_size_one_broadcasts_as_in_eager(self) -> None:
        """A size-1 dimension broadcasts: the symbolic capture for sizes >= 2 is never used for it."""
        class AddRows(Function):
            @staticmethod
            def forward(ctx, x, y):
                ctx.rows = x.shape[0]
                return x + y

            @staticmethod
            def backward(ctx, g):
                return (g.sum(0, keepdim=True) if ctx.rows == 1 else g), g

        cf = minihop.function(AddRows)
        for n in (6, 7, 9):
            assert_step_matches_eager(cf.apply, AddRows, r(n, 3), r(n, 3))
        for n in (7, 4):  # x of one row broadcasts over y's
            assert_step_matches_eager(cf.apply, AddRows, r(1, 3), r(n, 3))
        assert cf.stats.captures == 3  # 6 static, 7 symbolic (not 1), x of 1 row: its own

    def test_guard_forces_a_second_symbolic_capture(self) -> None:
        """A size that breaks the trace's guard (s0 > 4) gets its own capture; sizes on each side then hit."""
        cf = minihop.function(Branchy)
        for n in (8, 9, 3, 12, 2, 6, 4):
            assert_step_matches_eager(cf.apply, Branchy, r(n))
        assert cf.stats.captures == 3 and cf.stats.hits == 4
        exprs = [c.shape_guards.expression for c in cf.captures[1:]]
        assert exprs == ["5 <= T[0].size()[0]", "2 <= T[0].size()[0] and T[0].size()[0] <= 4"]

    def test_pinned_size_stays_right(self) -> None:
        """A size the code pins (== 5) is guarded to that value; other sizes get another capture."""
        cf = minihop.function(Pinned)
        for n in (4, 5, 6, 7, 5):
            assert_step_matches_eager(cf.apply, Pinned, r(n))
        assert cf.stats.captures == 3  # 4 static, 5 pinned, 6 symbolic (!= 5) serves 7

    def test_divisibility_guard(self) -> None:
        """view(-1, 2) on a symbolic size relies on an even size; an odd size is refused by eager and by minihop alike."""
        class Pairs(Function):
            @staticmethod
            def forward(ctx, x):
                return x.view(-1, 2).sum(1)

            @staticmethod
            def backward(ctx, g):
                return g.repeat_interleave(2)

        cf = minihop.function(Pairs)
        for n in (4, 6, 8, 10, 20):
            assert_step_matches_eager(cf.apply, Pairs, r(n))
        assert cf.stats.captures == 2
        with pytest.raises(RuntimeError):
            Pairs.apply(r(7))
        with pytest.raises(RuntimeError):
            cf.apply(r(7))

    def test_symbolic_refusal_falls_back_to_static(self) -> None:
        """A Function whose symbolic trace is refused (a float from sizes) is captured static per size instead, never an error."""
        cf = minihop.function(Unbiased)
        for n in (4, 5, 6, 5):
            assert_step_matches_eager(cf.apply, Unbiased, r(n, 3))
        assert cf.stats.captures == 3 and cf.stats.hits == 1
        assert all(c.shape_guards is None for c in cf.captures)

    def test_int_argument_that_changes_becomes_symbolic(self) -> None:
        """An int argument that changes becomes a SymInt (as Dynamo makes it): one capture serves the later values, saved on ctx for backward."""
        cf = minihop.function(Scale)
        for k in (2, 3, 4, 3, 9, 17):
            assert_step_matches_eager(cf.apply, Scale, r(5), k)
        assert cf.stats.captures == 2 and cf.stats.hits == 4
        static, symbolic = cf.captures
        assert static.key[1][1] == ("V", int, 2) and symbolic.key[1][1] == ("V", int, None)
        (k_in,) = sym_placeholders(symbolic.fwd)
        assert [s.description for s in symbolic.inputs if s.name == k_in.name] == ["k"]
        (out,) = [n for n in symbolic.fwd.graph.nodes if n.op == "output"]
        assert [n.name for n in out.args[0][1]] == [k_in.name]  # ctx.k saved as the SymInt
        for n in (6, 7):  # the tensor's size becomes symbolic too
            assert_step_matches_eager(cf.apply, Scale, r(n), 3)
        assert cf.stats.captures == 3

    def test_int_zero_and_one_specialise(self) -> None:
        """0 and 1 of a symbolic int get captures of their own, as sizes do."""
        cf = minihop.function(Scale)
        for k in (2, 3, 1, 0, 1, 5):
            assert_step_matches_eager(cf.apply, Scale, r(4), k)
        assert cf.stats.captures == 4
        guards = sorted(c.shape_guards.expression for c in cf.captures if c.shape_guards is not None)
        assert guards == ["2 <= T[0]", "T[0] == 0", "T[0] == 1"]

    def test_int_guards_and_pins(self) -> None:
        """A branch on a symbolic int is guarded (another side recaptures); range(k) pins k to its value."""
        class Steps(Function):
            @staticmethod
            def forward(ctx, x, k):
                ctx.k = k
                return x * 2 if k > 4 else x * 3

            @staticmethod
            def backward(ctx, g):
                return (g * 2 if ctx.k > 4 else g * 3), None

        class Repeat(Function):
            @staticmethod
            def forward(ctx, x, k):
                y = x
                for _ in range(k):
                    y = y * 1.5
                ctx.k = k
                return y

            @staticmethod
            def backward(ctx, g):
                return g * 1.5 ** ctx.k, None

        steps = minihop.function(Steps)
        for k in (6, 7, 9, 3, 2, 8):
            assert_step_matches_eager(steps.apply, Steps, r(3), k)
        assert steps.stats.captures == 3  # 6 static, 7 symbolic (k > 4), 3 symbolic (k <= 4)
        repeat = minihop.function(Repeat)
        for k in (2, 3, 4, 3):
            assert_step_matches_eager(repeat.apply, Repeat, r(3), k)
        assert repeat.stats.captures == 3 and repeat.stats.hits == 1  # each value pinned

    @pytest.mark.parametrize("use", list(INT_USES))
    def test_int_used_every_which_way(self, use: str) -> None:
        """An int argument that changes, used as a dim, a size, an index, in a branch, a string, a float...: eager's outputs and grads at each value (symbolic, pinned or static)."""
        fn_cls = int_user(INT_USES[use])
        cf = minihop.function(fn_cls)
        for k in (2, 3, 4, 6, 8, 3):  # each divides x's 24 elements (reshape)
            assert_step_matches_eager(cf.apply, fn_cls, r(6, 4), k)

    def test_size_printed_is_its_value(self) -> None:
        """str() / f-strings of a symbolic size in forward give the size (pinned), not the symbol's name."""
        class Labelled(Function):
            @staticmethod
            def forward(ctx, x):
                return x * len(f"{x.shape[0]}") + len(str(x.shape[0] * 10))

            @staticmethod
            def backward(ctx, g):
                return g * len(repr(g.shape[0]))

        cf = minihop.function(Labelled)
        for n in (5, 7, 12, 9, 123):
            assert_step_matches_eager(cf.apply, Labelled, r(n))
        assert all(c.shape_guards is None or "==" in c.shape_guards.expression for c in cf.captures)

    def test_bool_and_float_arguments_stay_specialised(self) -> None:
        """Bools and floats are not made symbolic: each value is part of the key."""
        cf = minihop.function(Scale)
        for k in (2.0, 3.0, 4.0, True, False):
            assert_step_matches_eager(cf.apply, Scale, r(5), k)
        assert cf.stats.captures == 5 and all(c.shape_guards is None for c in cf.captures)

    def test_int_named_dynamic_in_capture(self) -> None:
        """minihop.capture(F, x, k, dynamic={"k": []}) traces the int as a SymInt; other values run on it."""
        cap = minihop.capture(Scale, r(5), 3, dynamic={"k": []})
        for k in (3, 4, 11):
            assert_step_matches_eager(cap, Scale, r(5), k)
        with pytest.raises(minihop.GuardMismatchError, match="dynamic sizes outside"):
            cap(r(5), 1)

    @pytest.mark.parametrize("fn_cls,shape", [(MeanRows, (4,)), (Flatten, (3, 2)), (SplitFirst, (4,)),
                                              (NewZeros, (4,))], ids=lambda v: getattr(v, "__name__", ""))
    def test_sizes_saved_for_backward_follow_each_call(self, fn_cls: type, shape: tuple[int, ...]) -> None:
        """ctx.n / view(s0, -1) / split sizes / new_zeros(s0) saved for backward: right at every size of one symbolic capture."""
        cf = minihop.function(fn_cls)
        for n in (5, 6, 9, 14, 3):
            assert_step_matches_eager(cf.apply, fn_cls, r(n, *shape))
        assert cf.stats.captures == 2
        dynamic = cf.captures[1]
        (out,) = [n for n in dynamic.fwd.graph.nodes if n.op == "output"]
        assert any(isinstance(v.meta.get("val"), torch.SymInt) for v in out.args[0][1]), "no SymInt saved"

    def test_two_inputs_related_sizes(self) -> None:
        """Two inputs whose sizes change together share one symbol; unequal sizes fail in eager and in minihop alike."""
        cf = minihop.function(Add)
        for n in (3, 4, 7, 9):
            assert_step_matches_eager(cf.apply, Add, r(n, 8), r(n, 8))
        assert cf.stats.captures == 2
        with pytest.raises(RuntimeError):
            Add.apply(r(4, 8), r(5, 8))
        with pytest.raises(RuntimeError):
            cf.apply(r(4, 8), r(5, 8))
        assert_step_matches_eager(cf.apply, Add, r(11, 8), r(11, 8))  # the failed call changed nothing
        assert cf.stats.captures == 2 and cf.captures[1].dynamic_dims == {0: (0,), 1: (0,)}

    def test_dynamic_false_is_static_per_size(self) -> None:
        """dynamic=False: one capture per size, as before automatic dynamic."""
        cf = minihop.function(MySin, dynamic=False)
        for n in (3, 4, 5, 4):
            assert_step_matches_eager(cf.apply, MySin, r(n, 2))
        assert cf.stats.captures == 3 and all(c.shape_guards is None for c in cf.captures)

    def test_dynamic_true_is_symbolic_from_the_first_call(self) -> None:
        """dynamic=True: the first capture is symbolic in every dimension and serves the others."""
        cf = minihop.function(MySin, dynamic=True)
        for n, m in ((3, 4), (5, 2), (9, 9)):
            assert_step_matches_eager(cf.apply, MySin, r(n, m))
        assert cf.stats.captures == 1 and cf.captures[0].dynamic_dims == {0: (0, 1)}

    def test_captured_decorator_is_automatic(self) -> None:
        """@minihop.captured uses the automatic policy too."""
        @minihop.captured
        class Twice(Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, g):
                return g * 2

        for n in (3, 4, 5, 6):
            x = r(n)
            Twice.apply(x).sum().backward()
            exact(x.grad, torch.full((n,), 2.0), f"grad at {n}")
        assert Twice.minihop.stats.captures == 2

    def test_no_cache_limit_warning_for_many_sizes(self) -> None:
        """20 sizes stay far below cache_limit=8: no warning, no eviction (static shapes would warn)."""
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            cf = minihop.function(MySin, cache_limit=8)
            for n in SIZES:
                cf.apply(r(n, 2))
        assert cf.stats.evictions == 0
        static = minihop.function(MySin, cache_limit=8, dynamic=False)
        with pytest.warns(UserWarning, match="cache_limit=8"):
            for n in SIZES:
                static.apply(r(n, 2))
        assert static.stats.evictions == len(SIZES) - 8


# ---------------------------------------------------------------------------------------------
# Dynamo's marks
# ---------------------------------------------------------------------------------------------

class TestMarks:
    def test_mark_dynamic_makes_the_first_capture_symbolic(self) -> None:
        """mark_dynamic(x, 0): minihop.apply captures symbolic from the first call; later sizes hit."""
        for n in (5, 6, 7, 30):
            x = marked(r(n, 3), torch._dynamo.mark_dynamic, 0)
            assert_step_matches_eager(lambda t: minihop.apply(MySin, t), MySin, x)
        assert minihop.counters()["captures"] == 1
        (cap,) = MySin._minihop_default.captures
        assert cap.dynamic_dims == {0: (0,)}

    def test_capture_honours_marks(self) -> None:
        """minihop.capture reads mark_dynamic, maybe_mark_dynamic and mark_static from the tensors."""
        x = r(5, 3, 2)
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.maybe_mark_dynamic(x, -1)
        cap = minihop.capture(MySin, x)
        assert cap.dynamic_dims == {0: (0, 2)}
        assert len(sym_placeholders(cap.fwd)) == 2
        assert_step_matches_eager(cap, MySin, r(7, 3, 4))
        y = r(5, 3)
        torch._dynamo.mark_static(y, 1)
        assert minihop.capture(MySin, y, dynamic=True).dynamic_dims == {0: (0,)}

    def test_mark_static_keeps_the_automatic_policy_off_that_dimension(self) -> None:
        """mark_static(x, 0) with changing sizes: dimension 0 stays static, one capture per size."""
        cf = minihop.function(MySin)
        for n in (3, 4, 5):
            x = marked(r(n, 2), torch._dynamo.mark_static, 0)
            assert_step_matches_eager(cf.apply, MySin, x)
        assert cf.stats.captures == 3 and all(c.shape_guards is None for c in cf.captures)

    def test_mark_dynamic_wins_over_mark_static(self) -> None:
        """A dimension marked both ways is dynamic (mark_static has the lower precedence, as in Dynamo)."""
        x = r(5, 2)
        torch._dynamo.mark_static(x, 0)
        torch._dynamo.mark_dynamic(x, 0)
        assert minihop.capture(MySin, x).dynamic_dims == {0: (0,)}

    def test_marked_call_does_not_hit_a_static_capture(self) -> None:
        """After a static capture at size 5, a call at size 5 with dimension 0 marked dynamic recaptures symbolic."""
        cf = minihop.function(MySin)
        assert_step_matches_eager(cf.apply, MySin, r(5, 2))
        assert_step_matches_eager(cf.apply, MySin, marked(r(5, 2), torch._dynamo.mark_dynamic, 0))
        assert cf.stats.captures == 2 and cf.captures[1].dynamic_dims == {0: (0,)}
        assert_step_matches_eager(cf.apply, MySin, r(5, 2))  # unmarked: either capture serves it
        assert cf.stats.captures == 2

    def test_static_capture_called_with_a_marked_tensor_raises(self) -> None:
        """A Capture made static, called with a tensor whose dimension is marked dynamic, raises MH301."""
        cap = minihop.capture(MySin, r(5, 2))
        with pytest.raises(minihop.GuardMismatchError,
                           match=r"\[MH301\] Capture of MySin called with dimension 0 of x marked dynamic"):
            cap(marked(r(5, 2), torch._dynamo.mark_dynamic, 0))

    def test_specialised_mark_dynamic_is_refused_like_dynamo(self) -> None:
        """mark_dynamic on a dimension the code pins to 5: MH101 from apply and capture, as torch.compile raises ConstraintViolationError."""
        message = (r"\[MH101\] Pinned: dimension 0 of x is marked dynamic \(torch._dynamo.mark_dynamic\), "
                   r"but its code specialised it to 5\.")
        with pytest.raises(minihop.UnsupportedArgumentError, match=message):
            minihop.apply(Pinned, marked(r(5), torch._dynamo.mark_dynamic, 0))
        with pytest.raises(minihop.UnsupportedArgumentError, match=message):
            minihop.capture(Pinned, marked(r(5), torch._dynamo.mark_dynamic, 0))
        from torch.fx.experimental.symbolic_shapes import ConstraintViolationError
        torch.compiler.reset()
        with pytest.raises(ConstraintViolationError, match="specialized it to be a constant"):
            torch.compile(lambda t: Pinned.apply(t), backend="eager", fullgraph=True)(
                marked(r(5), torch._dynamo.mark_dynamic, 0))

    def test_maybe_mark_dynamic_may_specialise(self) -> None:
        """maybe_mark_dynamic on a dimension the code pins: no error, the capture is guarded to that size."""
        cf = minihop.function(Pinned)
        assert_step_matches_eager(cf.apply, Pinned, marked(r(5), torch._dynamo.maybe_mark_dynamic, 0))
        assert cf.captures[0].shape_guards.expression == "T[0].size()[0] == 5"
        assert_step_matches_eager(cf.apply, Pinned, marked(r(6), torch._dynamo.maybe_mark_dynamic, 0))
        assert cf.stats.captures == 2

    def test_mark_dynamic_on_size_one_is_static(self) -> None:
        """mark_dynamic on a size-1 dimension is specialised silently, as Dynamo does; size 1 is guarded."""
        cap = minihop.capture(MySin, marked(r(1, 3), torch._dynamo.mark_dynamic, 0))
        assert sym_placeholders(cap.fwd) == [] and cap.shape_guards.expression == "T[0].size()[0] == 1"
        with pytest.raises(minihop.GuardMismatchError, match="dynamic sizes outside"):
            cap(r(4, 3))

    def test_trace_refuses_mark_dynamic(self) -> None:
        """minihop.trace traces static shapes: a mark_dynamic argument is MH101, not silently static."""
        def fn(x: torch.Tensor) -> torch.Tensor:
            return MySin.apply(x)

        with pytest.raises(minihop.UnsupportedArgumentError,
                           match=r"\[MH101\] minihop.trace got x with dimension 0 marked dynamic"):
            minihop.trace(fn, marked(r(4, 2), torch._dynamo.mark_dynamic, 0))
        gm = minihop.trace(fn, marked(r(4, 2), torch._dynamo.maybe_mark_dynamic, 0))
        x = r(4, 2)
        exact(gm(x), MySin.apply(x), "traced output")

    def test_explain_lists_symbols_sources_and_guards(self) -> None:
        """explain() on a marked input: the symbol, the dimension it comes from, and its guard by argument name."""
        report = minihop.explain(MeanRows, marked(r(5, 3), torch._dynamo.mark_dynamic, 0), print_report=False)
        (symbol,) = report.symbols
        assert symbol.endswith(" = x.size(0)")
        [guard] = [g for g in report.guards if g.startswith("dynamic sizes: ")]
        assert guard == "dynamic sizes: 2 <= T[0].size()[0]  (T[0] is x)"
        assert ("ctx.n (SymInt)", "captured: a size symbol on ctx stays symbolic (saved for backward "
                "if it reads it)") in report.features
        assert "size symbols" in str(report)


# ---------------------------------------------------------------------------------------------
# The graphs for marked inputs, against torch.compile's
# ---------------------------------------------------------------------------------------------

def dynamo_bodies(fn_cls: type, args: tuple[Any, ...], marks: dict[int, int]) -> tuple[fx.GraphModule, fx.GraphModule]:
    """torch.compile's fwd_body_0 and bwd_body_0 for ``fn_cls.apply(*args)`` with ``marks``
    ({argument position: dimension}) set by torch._dynamo.mark_dynamic."""
    graphs: list[fx.GraphModule] = []

    def record(gm: fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    leaves = clone_args(args)
    for i, d in marks.items():
        torch._dynamo.mark_dynamic(leaves[i], d)
    torch.compiler.reset()
    torch.compile(lambda *a: fn_cls.apply(*a), backend=record, fullgraph=True)(*leaves)
    bodies = dict(graphs[-1].named_children())
    return bodies["fwd_body_0"], bodies["bwd_body_0"]


def shape_summary(gm: fx.GraphModule) -> tuple[Any, ...]:
    """Placeholder kinds in order, which fwd outputs/saved values are SymInts, and the op
    multiset of the live graph (Dynamo leaves unused ``x.size()`` reads behind; dropped)."""
    graph = copy.deepcopy(gm.graph)
    graph.eliminate_dead_code()

    def kind(node: Any) -> str:
        val = node.meta.get("val", node.meta.get("example_value")) if isinstance(node, fx.Node) else node
        return "sym" if isinstance(val, torch.SymInt) else "none" if val is None else "tensor"

    placeholders = tuple(kind(n) for n in graph.nodes if n.op == "placeholder")
    (out,) = [n for n in graph.nodes if n.op == "output"]
    outputs = tuple(tuple(kind(v) for v in part) if isinstance(part, (tuple, list)) else kind(part)
                    for part in out.args[0])
    ops = collections.Counter(_op_name(n, True) for n in graph.nodes if n.op.startswith("call"))
    return placeholders, outputs, ops


ORACLE_CASES = {
    "elementwise, saved input": (MySin, lambda: (r(5, 3),), {0: 0}),
    "ctx.n, expand and divide": (MeanRows, lambda: (r(5, 4),), {0: 0}),
    "view(s0, -1) and back": (Flatten, lambda: (r(5, 3, 2),), {0: 0}),
    "new_zeros(s0, 2)": (NewZeros, lambda: (r(5, 4),), {0: 0}),
    "two inputs, one size": (Add, lambda: (r(5, 3), r(5, 3)), {0: 0, 1: 0}),
    "batch of a matmul with weights": (Linear, lambda: (r(5, 3), r(4, 3), r(4)), {0: 0}),
}


class ExpandRows(Function):
    """A static-shaped input expanded to the dynamic batch size."""

    @staticmethod
    def forward(ctx, x, v):
        ctx.save_for_backward(v)
        return x + v.expand(x.shape[0], -1)

    @staticmethod
    def backward(ctx, g):
        (v,) = ctx.saved_tensors
        return g, g.sum(0, keepdim=True) * v



ORACLE_CASES.update({
    # x's size read before x is used: x (after its symbol) is taken there, as Dynamo does.
    "expand a static input to the batch size": (ExpandRows, lambda: (r(5, 3), r(1, 3)), {0: 0}),
    # bwd: the grad, then the symbol its shape holds, then what backward reads (Dynamo's order).
    "matmul, saved size symbol after the grad": (MatMul, lambda: (r(5, 3), r(3, 4)), {0: 0}),
})


# Where minihop's graphs still differ from torch.compile's (fixing one fails its test: move it up).
KNOWN_DIFFERENCES = {
    # n - 1 on a SymInt is invisible to minihop (no dispatch): it rebuilds the value from its
    # expression (-1 + s0) in each graph and saves s0; Dynamo records sub and saves its result.
    "split sizes from n - 1": (SplitFirst, lambda: (r(5, 4),), {0: 0}),
}


def compare_with_torch_compile(fn_cls: type, make_args: Any, marks: dict[int, int]) -> tuple[Any, Any]:
    """Capture ``fn_cls`` for marked clones of the arguments, check it at another batch size
    against eager; return its bodies' shape summaries and torch.compile's."""
    args = make_args()
    leaves = clone_args(args)
    for i, d in marks.items():
        torch._dynamo.mark_dynamic(leaves[i], d)
    cap = minihop.capture(fn_cls, *leaves)
    minihop.check_consistent(cap.fwd, cap.bwd)
    bigger = tuple(torch.randn(7, *a.shape[1:]).requires_grad_() if i in marks else a
                   for i, a in enumerate(args))
    assert_step_matches_eager(cap, fn_cls, *bigger)
    fwd, bwd = dynamo_bodies(fn_cls, args, marks)
    return (shape_summary(cap.fwd), shape_summary(cap.bwd)), (shape_summary(fwd), shape_summary(bwd))


class TestAgainstTorchCompile:
    @pytest.mark.parametrize("case", list(ORACLE_CASES))
    def test_bodies_match_torch_compile(self, case: str) -> None:
        """Marked-dynamic inputs: minihop's fwd/bwd have torch.compile's placeholder kinds and order, saved SymInts and ops."""
        mine, theirs = compare_with_torch_compile(*ORACLE_CASES[case])
        assert mine == theirs

    @pytest.mark.parametrize("case", list(KNOWN_DIFFERENCES))
    def test_known_differences(self, case: str) -> None:
        """Known differences from torch.compile's bodies for marked inputs: still there (fixing one fails here), and the capture still right."""
        mine, theirs = compare_with_torch_compile(*KNOWN_DIFFERENCES[case])
        assert mine != theirs
        assert [m[0] for m in mine] == [t[0] for t in theirs]  # the placeholder kinds and order agree
