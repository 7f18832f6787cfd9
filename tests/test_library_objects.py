"""Library objects as Python state: a queue, a buffer, an array, a file, written and read the
way user code does it, in forward, in backward and in forward's result.

Each object keeps state minihop does not model (``library_state``): the heap watch sees all it
shows of itself (attributes and what it hands pickle) and refuses any change made through its
own methods; containers whose whole state is their items (``array``, ``bytearray``,
``UserDict``) are watched and replayed as items; an object whose state cannot be seen at all (a
file, a ``SimpleQueue``) is refused before tracing. Before, each case here differed from eager
with no error: the write was made once, while tracing, and the captures' reads were not keyed
by what the object held. Every case runs eagerly and in strict, apply and fallback mode
(``eager_modes.matches_eager``); the caller also writes to the object between forward and
backward of the third call.
"""

from __future__ import annotations

import collections
import io
import os
import queue
import tempfile
from typing import Any

import pytest
import torch

import minihop
from minihop.errors import MinihopError, SideEffectError

import eager_modes

# name: (setup, a write, an expression of g that reads the object, its state, how to empty it)
CASES: dict[str, tuple[str, str, str, str, str]] = {
    "queue_value": ("import queue\nM = queue.Queue()", "M.put(1)", "g * M.qsize()",
                    "list(M.queue)", "M.queue.clear()"),
    "simple_queue": ("import queue\nM = queue.SimpleQueue()", "M.put(1)", "g * M.qsize()",
                     "M.qsize()", "exec('while not M.empty(): M.get()')"),
    "string_io": ("import io\nM = io.StringIO()", "M.write('ab')", "g * len(M.getvalue())",
                  "M.getvalue()", "M.seek(0); M.truncate()"),
    "bytes_io": ("import io\nM = io.BytesIO()", "M.write(b'ab')", "g * len(M.getvalue())",
                 "M.getvalue()", "M.seek(0); M.truncate()"),
    "array": ("import array\nM = array.array('d')", "M.append(1.5)", "g * len(M)", "list(M)", "del M[:]"),
    "bytearray": ("M = bytearray()", "M.extend(b'ab')", "g * len(M)", "bytes(M)", "M.clear()"),
    "user_list": ("import collections\nM = collections.UserList()", "M.append(2)", "g * len(M)",
                  "list(M)", "M.clear()"),
    "user_dict": ("import collections\nM = collections.UserDict()", "M['k'] = M.get('k', 0) + 1",
                  "g * M['k']", "dict(M)", "M.clear()"),
    "counter": ("import collections\nM = collections.Counter()", "M.update(['a'])", "g * M['a']",
                "dict(M)", "M.clear()"),
    "ordered_dict": ("import collections\nM = collections.OrderedDict(a=1, b=2)", "M.move_to_end('a')",
                     "g * M[next(iter(M))]", "list(M)", "M.clear(); M.update(a=1, b=2)"),
    "deque_rotate": ("import collections\nM = collections.deque([1, 2, 3])", "M.rotate(1)", "g * M[0]",
                     "list(M)", "M.clear(); M.extend([1, 2, 3])"),
    "event": ("import threading\nM = threading.Event()", "M.clear() if M.is_set() else M.set()",
              "g * (2 if M.is_set() else 3)", "M.is_set()", "M.clear()"),
    "heap": ("import heapq\nM = []", "heapq.heappush(M, -len(M))", "g * len(M)", "list(M)", "M.clear()"),
    "context_var": ("import contextvars\nM = contextvars.ContextVar('m', default=0)", "M.set(M.get() + 1)",
                    "g * M.get()", "M.get()", "M.set(0)"),
}
WHERE = ("forward", "backward", "result")


def _define(setup: str, write: str, read: str, where: str) -> dict[str, Any]:
    """``F`` making ``write`` in forward (and reading the object in backward), in backward, or
    in forward with a result computed from what it reads."""
    fwd, out, bwd_first, bwd = {"forward": (write, "x * 2", "pass", read),
                                "backward": ("pass", "x * 2", write, read),
                                "result": (write, "x * " + read.removeprefix("g * "), "pass", "g * 2")}[where]
    ns: dict[str, Any] = {"torch": torch, "__name__": "library_cases"}
    exec(f"""
{setup}
class F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        {fwd}
        return {out}

    @staticmethod
    def backward(ctx, g):
        {bwd_first}
        return {bwd}
""", ns)
    return ns


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("case", list(CASES))
def test_library_object_matches_eager(case: str, where: str) -> None:
    setup, write, read, state, reset = CASES[case]
    ns = _define(setup, write, read, where)
    eager_modes.matches_eager(
        ns["F"], lambda i: (torch.arange(1.0, 4.0).requires_grad_(),),
        state=lambda: eval(state, ns), reset=lambda: exec(reset, ns),
        mid=lambda i: exec(write, ns) if i == 2 else None)


def test_tensor_through_a_queue_matches_eager() -> None:
    """The first case the issue's "Open" list kept: a trace's write to a queue is refused (the
    queue is left as it was: no fake tensor in it); fallback runs eagerly."""
    import queue

    class Q(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            QUEUE.put(x.detach() * 2)
            return x.sin()

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * QUEUE.get_nowait()

    QUEUE = queue.Queue()
    eager_modes.matches_eager(Q, lambda i: (torch.arange(1.0, 4.0 + i % 2).requires_grad_(),),
                              state=lambda: [t.tolist() for t in QUEUE.queue], reset=QUEUE.queue.clear,
                              mid=lambda i: QUEUE.put(torch.full((3,), 7.0)) if i == 2 else None)
    QUEUE.queue.clear()
    tasks = QUEUE.unfinished_tasks
    with pytest.raises(SideEffectError, match=r"MH106.*QUEUE"):
        minihop.function(Q).apply(torch.ones(2, requires_grad=True))
    assert not QUEUE.queue and QUEUE.unfinished_tasks == tasks  # the trace's put was taken back


def test_library_object_argument_matches_eager() -> None:
    """The same object passed in: keyed by what it holds, its changes refused alike."""
    for make in (io.StringIO, lambda: __import__("collections").UserList()):
        box = make()

        class W(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, x: torch.Tensor, b: Any) -> torch.Tensor:
                (b.write if isinstance(b, io.StringIO) else b.append)("a")
                return x * 2

            @staticmethod
            def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
                return g * 3, None

        state = box.getvalue if isinstance(box, io.StringIO) else (lambda b=box: list(b))
        reset = (lambda b=box: (b.seek(0), b.truncate())) if isinstance(box, io.StringIO) else box.clear
        eager_modes.matches_eager(W, lambda i, b=box: (torch.ones(2, requires_grad=True), b),
                                  state=state, reset=reset)


def test_lru_cache_helper_attribute_matches_eager() -> None:
    """``memo.last = t`` on an ``lru_cache`` helper the code also calls: minihop swaps the
    helper while tracing (its cache would keep fake tensors), and the write went to the
    stand-in, lost. It now reaches the helper, where the heap watch sees it (refused: a tensor)."""
    import functools

    @functools.lru_cache(maxsize=None)
    def memo(n: int) -> int:
        return n + 1

    class L(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            memo.last = x.detach() * memo(3)
            return x * 2

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * memo.last

    eager_modes.matches_eager(L, lambda i: (torch.arange(1.0, 4.0).requires_grad_(),),
                              state=lambda: [memo.__dict__["last"].tolist()] if "last" in memo.__dict__ else [],
                              reset=lambda: memo.__dict__.pop("last", None))


def test_unseen_object_refused_before_tracing() -> None:
    """A file: its state cannot be seen or put back, so the trace must not touch it. The error
    names the object and its type; the file is untouched; fallback writes once per call."""
    with tempfile.TemporaryFile("w+") as log:
        class Logged(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
                LOG.write("f")
                return x * 2

            @staticmethod
            def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
                return g * 2

        LOG = log
        with pytest.raises(SideEffectError, match=r"Logged\.forward reaches LOG, a _io\.TextIOWrapper"):
            minihop.function(Logged).apply(torch.ones(2, requires_grad=True))
        log.seek(0)
        assert log.read() == ""
        with pytest.warns(UserWarning, match="eagerly"):
            f = minihop.function(Logged, fallback="eager")
            for _ in range(3):
                f.apply(torch.ones(2, requires_grad=True)).sum().backward()
        log.seek(0)
        assert log.read() == "fff"


def test_lock_is_not_refused() -> None:
    """A lock taken and released by ``with`` leaves nothing behind: captured, reused."""
    import threading
    lock = threading.Lock()

    class Locked(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            with LOCK:
                return x * 2

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * 2

    LOCK = lock
    minihop.reset()
    f = minihop.function(Locked)
    for _ in range(2):
        x = torch.ones(2, requires_grad=True)
        f.apply(x).sum().backward()
        assert x.grad.tolist() == [2.0, 2.0]
    assert minihop.counters()["captures"] == 1 and minihop.counters()["cache_hits"] == 1
    assert not lock.locked()


# --- crossed with transforms, dynamic sizes, ctx, and values library code sets ------------

def test_crossed_counter_under_func_grad() -> None:
    C = collections.Counter()
    class F(torch.autograd.Function):
        @staticmethod
        def forward(x):
            C.update(["f"])
            return x * C["f"]
        @staticmethod
        def setup_context(ctx, inputs, output):
            pass
        @staticmethod
        def backward(ctx, g):
            C.update(["b"])
            return g * 2
    def run(call):
        C.clear(); out = []
        for i in range(3):
            x = torch.arange(1.0, 4.0)
            out.append(torch.func.grad(lambda t: call(t).sum())(x).tolist())
        return out, dict(C)
    e = run(F.apply)
    for mode in ("strict", "fallback"):
        minihop.reset()
        try:
            m = run(minihop.function(F, fallback="eager" if mode == "fallback" else "raise"))
        except MinihopError as err:
            m = "refused " + str(err)[:80]
        ok = m == e or (mode == "strict" and isinstance(m, str))
        assert ok, (mode, m, e)

def test_crossed_library_dynamic_sizes() -> None:
    BUF = io.StringIO()
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            BUF.write("%d;" % x.shape[0])
            return x * 2
        @staticmethod
        def backward(ctx, g):
            return g * 2
    eager_modes.matches_eager(F, lambda i: (torch.arange(1.0, 3.0 + i).requires_grad_(),), state=BUF.getvalue,
                              reset=lambda: (BUF.seek(0), BUF.truncate()))

def test_crossed_queue_on_ctx_backward() -> None:
    Q = queue.Queue()
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, q):
            ctx.q = q
            return x * 2
        @staticmethod
        def backward(ctx, g):
            ctx.q.put(int(g.shape[0]))
            return g * 2, None
    eager_modes.matches_eager(F, lambda i: (torch.arange(1.0, 3.0 + i % 2).requires_grad_(), Q),
                              state=lambda: list(Q.queue), reset=Q.queue.clear)

def test_crossed_counter_dynamic_key() -> None:
    C = collections.Counter()
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            C.update([x.shape[0]])
            return x * C[x.shape[0]]
        @staticmethod
        def backward(ctx, g):
            return g * 2
    eager_modes.matches_eager(F, lambda i: (torch.arange(1.0, 3.0 + i % 3).requires_grad_(),), state=lambda: dict(C), reset=C.clear, steps=6)

def test_crossed_env_read_after_own_write() -> None:
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            n = int(os.environ.get("MH_N", "0"))
            return x * (n + 1)
        @staticmethod
        def backward(ctx, g):
            return g * 2
    try:
        eager_modes.matches_eager(F, lambda i: (torch.arange(1.0, 4.0).requires_grad_(),),
                                  between=lambda i: os.environ.__setitem__("MH_N", str(i)), reset=lambda: os.environ.pop("MH_N", None))
    finally:
        os.environ.pop("MH_N", None)

def test_crossed_setdefault_list_append() -> None:
    D = {}
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            D.setdefault("seen", []).append(x.shape[0])
            return x * len(D["seen"])
        @staticmethod
        def backward(ctx, g):
            return g * 2
    eager_modes.matches_eager(F, lambda i: (torch.arange(1.0, 4.0).requires_grad_(),), state=lambda: {k: list(v) for k, v in D.items()}, reset=D.clear)

def test_crossed_dict_update_constant() -> None:
    D = {}
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            D.update(mode="train", calls=D.get("calls", 0) + 1)
            return x * D["calls"]
        @staticmethod
        def backward(ctx, g):
            return g * 2
    eager_modes.matches_eager(F, lambda i: (torch.arange(1.0, 4.0).requires_grad_(),), state=lambda: dict(D), reset=D.clear)


def test_a_value_library_code_set_is_an_assumption_explain_shows() -> None:
    """``COUNTS.update(["k"])`` set ``COUNTS["k"]``: the place is guarded (what was there before
    each call), named by ``explain`` with the line of the call that set it."""
    counts: collections.Counter = collections.Counter()

    class Counts(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            COUNTS.update(["k"])
            return x * 2

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * 2

    COUNTS = counts
    report = str(minihop.explain(Counts, torch.ones(3, requires_grad=True), print_report=False))
    line = Counts.forward.__code__.co_firstlineno + 2
    assert f"Python value COUNTS['k'] read by forward: == 0  [File \"{__file__}\", line {line}]" in report
    assert "COUNTS['k'] = 1  (set, replayed each time forward runs)" in report


# --- reached through a callable or a tuple: a bound method, a partial, a tuple ---------------

_CALLBACK_QUEUE: queue.Queue = queue.Queue()


class _Box:
    k = 0


_BOX = _Box()
_TUPLE = (_BOX,)


class _CallsIt(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cb: Any) -> torch.Tensor:
        cb(1)
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g * 2, None


class _CallsItInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cb: Any) -> torch.Tensor:
        ctx.cb = cb
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.cb(1)
        return g * 2, None


class _ThroughGlobalTuple(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        _TUPLE[0].k = _TUPLE[0].k + 1
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * _TUPLE[0].k


@pytest.mark.parametrize("fn_cls", [_CallsIt, _CallsItInBackward], ids=["forward", "backward"])
@pytest.mark.parametrize("callback", ["bound", "partial"])
def test_a_library_object_reached_through_a_callable_matches_eager(fn_cls: type, callback: str) -> None:
    """``cb = Q.put`` (or ``functools.partial(Q.put)``) passed in and called: the heap watch did
    not look into a bound method's object or a partial's function, so the queue was unwatched."""
    import functools
    cb = _CALLBACK_QUEUE.put if callback == "bound" else functools.partial(_CALLBACK_QUEUE.put)
    eager_modes.matches_eager(fn_cls, lambda i: (torch.arange(1.0, 4.0).requires_grad_(), cb),
                              state=lambda: list(_CALLBACK_QUEUE.queue), reset=_CALLBACK_QUEUE.queue.clear)


def test_an_object_in_a_global_tuple_matches_eager() -> None:
    """``T[0].k = T[0].k + 1`` with ``T = (box,)``: tuples were not walked, the write was unseen."""
    eager_modes.matches_eager(_ThroughGlobalTuple, lambda i: (torch.arange(1.0, 4.0).requires_grad_(),),
                              state=lambda: _BOX.k, reset=lambda: setattr(_BOX, "k", 0))


@pytest.mark.parametrize("make", [lambda: collections.UserDict(k=2.0), lambda: collections.deque([2.0]),
                                  lambda: __import__("array").array("d", [2.0])], ids=["UserDict", "deque", "array"])
def test_a_new_container_holding_the_same_items_reuses_the_capture(make: Any) -> None:
    """Keyed by its items, as a list or a dict is: a new one per call with the same items is
    the same key (keying these by identity, too, captured on every call)."""
    class First(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, held: Any) -> torch.Tensor:
            return x * (held["k"] if isinstance(held, collections.UserDict) else held[0])

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
            return g * 2, None

    minihop.reset()
    call = minihop.function(First)
    for _ in range(3):
        call(torch.ones(2, requires_grad=True), make())
    assert minihop.counters()["captures"] == 1 and minihop.counters()["cache_hits"] == 2
