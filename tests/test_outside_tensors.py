"""Tensors forward puts outside its return value (tracer/outside.py, runtime/writes.py).

A forward that sets ``hard._soft = soft`` on a tensor it returns, appends activations to a
list argument, caches on a config object or a global: eager leaves the real tensors there, so
every call of a capture (cache hits included) must too, or refuse with a coded error.
"""

from __future__ import annotations

import types

import pytest
import torch

import minihop
from minihop.testing import assert_matches_eager


# ---- the user's Functions ---------------------------------------------------------------

class Spike(torch.autograd.Function):
    """Straight-through spike: the hard output carries its soft surrogate."""

    @staticmethod
    def forward(ctx, x):
        soft = x.sigmoid()
        hard = (soft > 0.5).to(x.dtype)
        hard._soft = soft
        hard.tag = "spike"
        hard._n = x.shape[0]
        ctx.save_for_backward(soft)
        return hard

    @staticmethod
    def backward(ctx, g):
        (soft,) = ctx.saved_tensors
        return g * soft * (1 - soft)


class SpikePair(torch.autograd.Function):
    """Two outputs and a nested one, each tagged."""

    @staticmethod
    def forward(ctx, x, w):
        pre = x * w
        a = pre.tanh()
        b = pre.relu()
        c = pre.sin()
        b._pre = pre
        a.kind = "tanh"
        c._from = a
        return a, b, [c]

    @staticmethod
    def backward(ctx, ga, gb, gc):
        return ga * 2, gb * 3


class LogActivations(torch.autograd.Function):
    """Logs its hidden activation into a caller's list and dict."""

    @staticmethod
    def forward(ctx, x, acts, store):
        h = x.exp()
        acts.append(h)
        acts.append(x)
        store["pre"] = h * 2
        ctx.save_for_backward(h)
        return h.sum(dim=0)

    @staticmethod
    def backward(ctx, g):
        (h,) = ctx.saved_tensors
        return g * h, None, None


class Config:
    def __init__(self, scale: float) -> None:
        self.scale = scale


class CacheOnConfig(torch.autograd.Function):
    """Caches its result, and a view of its input, on a config object."""

    @staticmethod
    def forward(ctx, x, cfg):
        y = x * cfg.scale
        cfg.cache = y
        cfg.last = x[0]
        return y.clone()

    @staticmethod
    def backward(ctx, g):
        return g * 2.0, None


_CACHE: list = []
_STORE: dict = {}
_STATE = types.SimpleNamespace(step=0)


class CacheInGlobals(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.cos()
        _CACHE.append(y)
        _STORE["y"] = y * 3
        _STATE.last = x
        return y * 2

    @staticmethod
    def backward(ctx, g):
        return g * -2.0


def _closure_function():
    seen: list = []

    class InClosure(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            seen.append(x + 1)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    return InClosure, seen


# ---- helpers --------------------------------------------------------------------------

def _weighted_loss(out):
    leaves = [t for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, torch.Tensor)]
    total = 0
    for i, t in enumerate(leaves):
        if t.requires_grad:
            total = total + (t * (i + 1.5)).sum()
    return total


def _assert_same_tensor(mine, eager, where, mine_inputs, eager_inputs):
    assert isinstance(eager, torch.Tensor), f"{where}: eager holds {type(eager).__name__}"
    assert isinstance(mine, torch.Tensor), f"{where}: minihop holds {type(mine).__name__}"
    assert type(mine) is torch.Tensor, f"{where}: minihop holds a {type(mine).__name__}"
    torch.testing.assert_close(mine, eager, msg=lambda s: f"{where}: {s}")
    assert mine.requires_grad == eager.requires_grad, where
    assert (mine.grad_fn is None) == (eager.grad_fn is None), where
    for m_in, e_in in zip(mine_inputs, eager_inputs, strict=True):
        assert (mine is m_in) == (eager is e_in), f"{where}: identity with an input differs"
        assert (mine._base is m_in) == (eager._base is e_in), f"{where}: view-of-input differs"


def _compare_calls(fn, make_args, probe, calls=3, apply=None):
    """Run eager ``fn.apply`` and minihop on clones of the same arguments, ``calls`` times;
    compare outputs, the tensors ``probe(args, out)`` names, and every input's grad."""
    apply = apply or (lambda *a: minihop.apply(fn, *a))
    for call in range(calls):
        torch.manual_seed(call)
        eager_args = make_args()
        torch.manual_seed(call)
        mine_args = make_args()  # its own containers and objects, with the same values
        eager_out = fn.apply(*eager_args)
        eager_seen = probe(eager_args, eager_out)
        mine_out = apply(*mine_args)
        mine_seen = probe(mine_args, mine_out)
        assert eager_seen.keys() == mine_seen.keys()
        e_inputs = [a for a in eager_args if isinstance(a, torch.Tensor)]
        m_inputs = [a for a in mine_args if isinstance(a, torch.Tensor)]
        for name, e in eager_seen.items():
            m = mine_seen[name]
            if isinstance(e, torch.Tensor):
                _assert_same_tensor(m, e, f"call {call}: {name}", m_inputs, e_inputs)
            else:
                assert type(m) is type(e) and m == e, f"call {call}: {name}: eager {e!r}, minihop {m!r}"
        _weighted_loss(eager_out).backward()
        _weighted_loss(mine_out).backward()
        for i, (e, m) in enumerate(zip(e_inputs, m_inputs, strict=True)):
            assert (e.grad is None) == (m.grad is None), f"grad of input {i}"
            if e.grad is not None:
                torch.testing.assert_close(m.grad, e.grad)


@pytest.fixture(autouse=True)
def _fresh():
    minihop.reset()
    _CACHE.clear()
    _STORE.clear()
    vars(_STATE).pop("last", None)
    yield
    minihop.reset()


def _hits():
    return minihop.counters()["cache_hits"]


# ---- attributes on returned tensors ----------------------------------------------------

class TestOutputAttributes:
    def test_spike_soft_surrogate_every_call(self):
        """``hard._soft`` is the real, history-free surrogate, on hits too."""
        def probe(args, out):
            return {"out": out, "out._soft": out._soft, "tag": out.tag, "_n": out._n}

        _compare_calls(Spike, lambda: (torch.randn(5, requires_grad=True),), probe, calls=4)
        assert _hits() >= 2

    def test_spike_surrogate_has_no_history(self):
        """As in eager: forward ran under no-grad, so the surrogate does not require grad."""
        x = torch.randn(4, requires_grad=True)
        out = minihop.apply(Spike, x)
        assert out._soft.requires_grad is False and out._soft.grad_fn is None
        torch.testing.assert_close(out._soft, x.detach().sigmoid())

    def test_tuple_and_nested_outputs(self):
        """Attributes on each item of a tuple output and on a nested output."""
        def probe(args, out):
            a, b, (c,) = out
            return {"a": a, "b": b, "c": c, "b._pre": b._pre, "a.kind": a.kind, "c._from": c._from}

        _compare_calls(SpikePair, lambda: (torch.randn(3, requires_grad=True),
                                           torch.randn(3, requires_grad=True)), probe)
        assert _hits() >= 1

    def test_capture_call_and_contract(self):
        """Through ``minihop.capture(...)(...)``; the pair stays consistent."""
        x = torch.randn(6, requires_grad=True)
        cap = minihop.capture(Spike, x)
        minihop.check_consistent(cap.fwd, cap.bwd)
        for _ in range(2):
            out = cap(x)
            torch.testing.assert_close(out._soft, x.detach().sigmoid())
            assert out.tag == "spike" and out._n == 6
        assert_matches_eager(Spike, x)


# ---- containers and objects the caller owns ----------------------------------------------

class TestCallerContainers:
    def test_list_and_dict_arguments(self):
        """Activations appended to a list argument and set in a dict argument."""
        def probe(args, out):
            _, acts, store = args
            assert len(acts) == 2
            return {"out": out, "acts[0]": acts[0], "acts[1]": acts[1], "store['pre']": store["pre"]}

        _compare_calls(LogActivations, lambda: (torch.randn(3, 2, requires_grad=True), [], {}), probe)
        assert _hits() >= 1

    def test_list_that_already_holds_tensors(self):
        """A list argument holding tensors is copied for tracing; the caller's list still grows."""
        acts = [torch.ones(2)]
        x = torch.randn(3, 2, requires_grad=True)
        minihop.apply(LogActivations, x, acts, {})
        assert len(acts) == 3 and acts[0] is not None
        torch.testing.assert_close(acts[1], x.detach().exp())
        assert acts[2] is x

    def test_config_object_cache_and_input_view(self):
        """``cfg.cache = y`` and ``cfg.last = x[0]`` (a view of the input, as in eager)."""
        def probe(args, out):
            _, cfg = args
            return {"out": out, "cfg.cache": cfg.cache, "cfg.last": cfg.last}

        _compare_calls(CacheOnConfig, lambda: (torch.randn(4, 3, requires_grad=True), Config(2.0)),
                       probe, calls=4)
        assert _hits() >= 2

    def test_each_call_writes_to_its_own_arguments(self):
        """The location is resolved from each call's arguments."""
        first, second = Config(2.0), Config(2.0)
        x1, x2 = torch.randn(4, 3), torch.randn(4, 3)
        minihop.apply(CacheOnConfig, x1, first)
        minihop.apply(CacheOnConfig, x2, second)
        torch.testing.assert_close(first.cache, x1 * 2)
        torch.testing.assert_close(second.cache, x2 * 2)
        assert second.last._base is x2

    def test_globals_and_closure(self):
        """A module-level list, dict and object, and a closure list."""
        def probe(args, out):
            seen = {"out": out, "_CACHE[-1]": _CACHE[-1], "_STORE['y']": _STORE["y"],
                    "_STATE.last": _STATE.last}
            _CACHE.clear()  # keep the global's guard the same from call to call
            return seen

        _compare_calls(CacheInGlobals, lambda: (torch.randn(3, requires_grad=True),), probe)
        assert _hits() >= 1

        fn, seen = _closure_function()
        x = torch.randn(3, requires_grad=True)
        fn.apply(x)
        eager = seen.pop()
        mine = minihop.apply(fn, x.detach().clone().requires_grad_(True))
        assert len(seen) == 1 and type(seen[0]) is torch.Tensor
        torch.testing.assert_close(seen[0], eager)
        assert seen[0].requires_grad == eager.requires_grad
        torch.testing.assert_close(mine, x * 2)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.sub = torch.nn.Identity()


class RecordsOnModule(torch.autograd.Function):
    """Keeps its activation on the module argument (a plain attribute, as on any object)."""

    @staticmethod
    def forward(ctx, x, net):
        y = net.lin(x)
        net.last = y
        net.sub.seen = x * 2
        return y * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


class ReturnsWhatItLogs(torch.autograd.Function):
    """Appends an output it also returns: eager's list holds the returned tensor itself."""

    @staticmethod
    def forward(ctx, x, sink):
        y = x * 2
        sink.append(y)
        z = x * 3
        z.twin = y
        return y, z

    @staticmethod
    def backward(ctx, gy, gz):
        return gy * 2 + gz * 3, None


class TestMoreRoots:
    def test_module_argument(self):
        """``net.last = y`` and ``net.sub.seen = ...`` on a module argument, hits included."""
        net = Net()

        def make():
            x = torch.randn(2, 3, requires_grad=True)
            for name in ("last",):
                vars(net).pop(name, None)
            vars(net.sub).pop("seen", None)
            return x, net

        def probe(args, out):
            return {"out": out, "net.last": args[1].last, "net.sub.seen": args[1].sub.seen}

        _compare_calls(RecordsOnModule, make, probe)
        assert _hits() >= 1

    def test_returned_tensor_is_the_logged_one(self):
        """The list holds the very tensor returned (with its grad_fn), as in eager."""
        x = torch.randn(3, requires_grad=True)
        eager_sink: list = []
        ey, ez = ReturnsWhatItLogs.apply(x, eager_sink)
        assert eager_sink[0] is ey and ez.twin is ey
        for _ in range(2):
            sink: list = []
            y, z = minihop.apply(ReturnsWhatItLogs, x, sink)
            assert sink[0] is y and z.twin is y and y.grad_fn is not None
            torch.testing.assert_close(y, ey)
        assert _hits() >= 1


# ---- entry points -----------------------------------------------------------------------

@pytest.mark.parametrize("fallback", ["raise", "eager"])
def test_minihop_function_entry(fallback):
    """``minihop.function(F)`` in strict mode and with ``fallback='eager'`` captures these."""
    wrapped = minihop.function(CacheOnConfig, fallback=fallback)

    def probe(args, out):
        _, cfg = args
        return {"out": out, "cfg.cache": cfg.cache, "cfg.last": cfg.last}

    _compare_calls(CacheOnConfig, lambda: (torch.randn(4, 3, requires_grad=True), Config(3.0)),
                   probe, apply=wrapped)
    assert minihop.counters()["fallbacks"] == 0
    assert _hits() >= 1


def test_graphs_hold_hidden_outputs_after_the_users():
    """The cached tensor is a fwd output after the user's one, with an unused grad in bwd."""
    cap = minihop.capture(CacheOnConfig, torch.randn(4, 3, requires_grad=True), Config(2.0))
    minihop.check_consistent(cap.fwd, cap.bwd)
    outputs = [n for n in cap.fwd.graph.nodes if n.op == "output"][0].args[0][0]
    assert [n.target for n in outputs] == ["clone", __import__("operator").mul,
                                           __import__("operator").getitem]
    grads = [n.name for n in cap.bwd.graph.nodes if n.op == "placeholder"]
    assert grads == ["g", "unused_0", "unused_1"]
    assert cap.top_level == (True, False, False)


# ---- refusals -----------------------------------------------------------------------------

class Holder:
    pass


class StoresHolder(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cfg):
        holder = Holder()
        holder.t = x * 2
        cfg.holder = holder
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g, None


_LOG: list = []


class LogsNumber(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        _LOG.append(1)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class AppendsThenFails(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, acts):
        acts.append(x * 2)
        if torch.rand((), generator=torch.Generator().manual_seed(0)) > 0.5:  # random: refused
            return x * 3
        return x * 4

    @staticmethod
    def backward(ctx, g):
        return g * 3, None


class TestRefusals:
    def test_tensor_inside_a_new_object(self):
        """A tensor stored on an object forward made has no per-call route: MH106."""
        cfg = Config(1.0)
        with pytest.raises(minihop.SideEffectError,
                           match=r"(?s)\[MH106\] StoresHolder.forward writes to cfg\.holder "
                                 r"\(line \d+\): it puts a Holder there that holds a tensor.*"
                                 r"What to do: Store the tensor itself there"):
            minihop.capture(StoresHolder, torch.randn(3), cfg)
        assert not hasattr(cfg, "holder"), "a fake tensor was left on the caller's object"

    def test_python_value_into_a_global_is_replayed(self):
        """A Python value appended to a global list is appended on every call, as in eager
        (capturing alone appends nothing)."""
        _LOG.clear()
        cap = minihop.capture(LogsNumber, torch.randn(3))
        assert _LOG == []
        for _ in range(3):
            cap(torch.randn(3))
        assert _LOG == [1, 1, 1]
        _LOG.clear()

    def test_failing_forward_leaves_no_fake_behind(self):
        """A forward refused after its write leaves the caller's list as it was; the eager
        fallback then gives eager's real tensor."""
        acts: list = []
        with pytest.raises(minihop.DataDependentError):
            minihop.capture(AppendsThenFails, torch.randn(3), acts)
        assert acts == []
        x = torch.randn(3)
        with pytest.warns(UserWarning):
            minihop.function(AppendsThenFails, fallback="eager")(x, acts)
        assert len(acts) == 1 and type(acts[0]) is torch.Tensor
        torch.testing.assert_close(acts[0], x * 2)

    def test_save_refuses_outside_writes(self, tmp_path):
        cap = minihop.capture(CacheOnConfig, torch.randn(2, 2), Config(1.0))
        with pytest.raises(minihop.UnsupportedOutputError, match=r"writes outside its return value \(cfg\.cache\)"):
            cap.save(str(tmp_path / "c.pt"))
