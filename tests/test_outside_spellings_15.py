"""Hostile spellings, round 15 (issue #28, round 20): what an ``lru_cache`` helper hands back,
tried from outside against eager in strict, apply and fallback mode (``eager_modes.matches_eager``).

Differences from eager before this round (``tracer/cache_entries.py``): a helper returning
tensors was traced through, bypassing its cache, and the graphs computed the table afresh on
every call, while eager's code gets the very tensor the cache holds. So

- a table the caller (or an earlier backward) wrote in place (``table(4).add_(1)``) was read
  as first made, in every mode (nothing refused);
- a random table drawn once (``noise(n)`` returning ``torch.randn(n)``) was drawn again on
  every call: other numbers, and the global random stream moved on;
- a tuple of tensors from ``functools.cache`` (``pair(4)[1].add_(1)``) likewise.

Now the cache's own entry (looked up without a hit being counted, made where missing by the
capture's first read of it) is an input read through the place "that call's result" on every
call and when backward runs; its hits and misses stay eager's. A helper that would draw random
numbers for an entry not yet made is refused (eager draws them at the call; fallback: eager),
and a table computed for a dynamic size is checked against the cache's entry for this call's
sizes and serves one call only.

Also:

- an object on ctx that backward changes more than four levels down (``ctx.info.c.c.c.c.c.n
  += 1``), the loss differentiated twice: what ctx holds was compared four levels deep
  (``effects.held``), below that by identity, so the second backward reused the first's trace
  with the value the first read. It is compared as deep as a budget allows (a cycle by
  identity); past it, nothing is assumed unchanged: refused, naming the budget;
- a lazy module (``nn.LazyLinear``) passed in before its first call: the call key read its
  parameter's shape, and torch's ``RuntimeError`` came out in fallback mode too. Refused now
  (MH101), so fallback runs eager, whose first call makes the parameters;
- a global list that is, on some calls, an item of a list passed in (``box[0].append(1)`` beside
  ``len(G)``): the sharing a capture assumes compared the top-level arguments only with the
  objects along the places read, so a capture made where ``box[0]`` was another list served a
  call where it was ``G``. The objects holding state inside the arguments are part of it now;
- ``torch.get_autocast_dtype("cpu")`` read with autocast off, ``torch.set_autocast_dtype``
  between calls: the call key holds the autocast dtype only where autocast is on, so the
  traced answer was reused. It is a setting read now (every device's, keyed whole).
"""

from __future__ import annotations

import functools
import sys
import types
import warnings
from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop
from minihop.errors import SideEffectError, UnsupportedArgumentError

from eager_modes import matches_eager


def _x(i: int, n: int = 4) -> torch.Tensor:
    return (torch.linspace(-1.0, 1.0, n) + i).requires_grad_()


def _args(i: int) -> tuple[torch.Tensor]:
    return (_x(i),)


@functools.lru_cache(maxsize=None)
def _table(n: int) -> torch.Tensor:
    return torch.arange(float(n))


class _Table(Function):
    @staticmethod
    def forward(ctx, x):
        return x * _table(x.shape[0])

    @staticmethod
    def backward(ctx, g):
        return g * _table(g.shape[0])


def _table_state() -> Any:
    return tuple(_table.cache_info()), _table(4).clone()


def test_a_cached_table_written_in_place_between_calls():
    matches_eager(_Table, _args, between=lambda i: _table(4).add_(1.0), reset=_table.cache_clear,
                  state=_table_state, refusable=False)


def test_a_cached_table_written_in_place_before_backward():
    matches_eager(_Table, _args, mid=lambda i: _table(4).mul_(2.0), reset=_table.cache_clear,
                  state=_table_state, refusable=False)


@functools.lru_cache(maxsize=None)
def _noise(n: int) -> torch.Tensor:
    return torch.randn(n)


class _Noise(Function):
    @staticmethod
    def forward(ctx, x):
        return x * _noise(4)

    @staticmethod
    def backward(ctx, g):
        return g * _noise(4)


def test_a_random_table_drawn_once_by_the_cache():
    # Cold cache: the first call's draw is eager's (refused in strict, eager in fallback);
    # then the table is read from the cache, never drawn again.
    matches_eager(_Noise, _args, reset=_noise.cache_clear, state=lambda: _noise.cache_info().currsize)


def test_a_random_table_already_cached_is_captured_and_read():
    matches_eager(_Noise, _args, reset=lambda: (_noise.cache_clear(), torch.manual_seed(7), _noise(4)), refusable=False,
                  between=lambda i: _noise(4).mul_(-1.0))


def test_a_random_table_not_cached_yet_is_refused_naming_the_draw():
    _noise.cache_clear()
    with pytest.raises(SideEffectError, match=r"MH106.*_noise \(an lru_cache helper\) draws random numbers \(randn\)"):
        minihop.capture(_Noise, _x(0))


@functools.cache
def _pair(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ones(n), torch.arange(float(n))


class _Pair(Function):
    @staticmethod
    def forward(ctx, x):
        a, b = _pair(4)
        return x * a + b

    @staticmethod
    def backward(ctx, g):
        return g * _pair(4)[0]


def test_a_cached_tuple_written_in_place_between_calls():
    matches_eager(_Pair, _args, reset=_pair.cache_clear, between=lambda i: _pair(4)[1].add_(1.0),
                  refusable=False)


def test_a_cached_tuple_written_in_place_before_backward():
    matches_eager(_Pair, _args, reset=_pair.cache_clear, mid=lambda i: _pair(4)[0].add_(1.0),
                  refusable=False)


@functools.lru_cache(maxsize=None)
def _acc(n: int) -> torch.Tensor:
    return torch.zeros(n)


class _Accumulate(Function):
    @staticmethod
    def forward(ctx, x):
        a = _acc(4)
        a.add_(x)  # (the cache's tensor itself, as eager writes it)
        return x * a

    @staticmethod
    def backward(ctx, g):
        return g * _acc(4)


def test_forward_writing_into_the_cached_table():
    matches_eager(_Accumulate, _args, reset=_acc.cache_clear, state=lambda: _acc(4).clone(), refusable=False)


@functools.lru_cache(maxsize=1)
def _one(n: int) -> torch.Tensor:
    return torch.arange(float(n))


class _Evicted(Function):
    @staticmethod
    def forward(ctx, x):
        return x * _one(x.shape[0])

    @staticmethod
    def backward(ctx, g):
        return g * _one(g.shape[0])


def test_a_one_entry_cache_evicted_by_sizes_written_in_place():
    matches_eager(_Evicted, lambda i: (_x(0, 4 + i % 2),), reset=_one.cache_clear,
                  between=lambda i: _one(4 + i % 2).mul_(2.0), state=lambda: tuple(_one.cache_info()))


@functools.lru_cache(maxsize=8, typed=True)
def _scaled(n: int, scale: float = 1.0) -> torch.Tensor:
    return torch.arange(float(n)) * scale


class _Keywords(Function):
    @staticmethod
    def forward(ctx, x, s):
        ctx.s = s
        return x * _scaled(4, scale=s)

    @staticmethod
    def backward(ctx, g):
        return g * _scaled(4, scale=ctx.s), None


def test_a_typed_bounded_cache_called_with_keywords():
    # The entry is looked up by the key functools makes (keywords, types): its counts are eager's.
    matches_eager(_Keywords, lambda i: (_x(i), [1.0, 2.0, 1.0, 2.0][i]), reset=_scaled.cache_clear,
                  between=lambda i: _scaled(4, scale=1.0).add_(0.5), state=lambda: tuple(_scaled.cache_info()),
                  refusable=False)


def test_counts_are_eagers_in_every_mode():
    matches_eager(_Table, _args, reset=_table.cache_clear, state=lambda: tuple(_table.cache_info()), refusable=False)


class _BackwardOnly(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * _table(4)


def test_a_table_only_backward_reads_rewritten_before_backward():
    matches_eager(_BackwardOnly, _args, reset=_table.cache_clear, mid=lambda i: _table(4).sub_(0.25),
                  state=lambda: tuple(_table.cache_info()), refusable=False)


def test_the_table_is_a_graph_input_read_from_the_cache():
    _table.cache_clear()
    _table(4)
    capture = minihop.capture(_Table, _x(0))
    assert any("_table" in s.name for s in capture.inputs), [s.name for s in capture.inputs]
    assert "arange" not in capture.fwd.code  # (read, not computed afresh)


@functools.lru_cache(maxsize=None)
def _table_dict(n: int) -> dict[str, Any]:
    return {"w": torch.arange(float(n)), "n": n}


class _DictEntry(Function):
    @staticmethod
    def forward(ctx, x):
        d = _table_dict(4)
        return x * d["w"] * d["n"]

    @staticmethod
    def backward(ctx, g):
        return g * _table_dict(4)["w"]


def test_a_plain_value_in_a_cached_dict_changed_between_calls():
    # (the entry's other values are read from it too: guarded, ``_table_dict(4)['n']``)
    def between(i: int) -> None:
        _table_dict(4)["n"] = 4 + i
    matches_eager(_DictEntry, _args, reset=_table_dict.cache_clear, between=between, refusable=False)


def test_a_tensor_in_a_cached_dict_replaced_before_backward():
    def mid(i: int) -> None:
        _table_dict(4)["w"] = torch.full((4,), float(i) + 3.0)
    matches_eager(_DictEntry, _args, reset=_table_dict.cache_clear, mid=mid, refusable=False)


@functools.lru_cache(maxsize=None)
def _norm(n: int) -> float:
    return float(torch.arange(float(n)).sum())


class _Norm(Function):
    @staticmethod
    def forward(ctx, x):
        return x / _norm(4)

    @staticmethod
    def backward(ctx, g):
        return g / _norm(4)


def test_a_cached_number_taken_from_a_table_it_made_is_captured():
    matches_eager(_Norm, _args, reset=_norm.cache_clear, state=lambda: tuple(_norm.cache_info()), refusable=False)


_BUILT: list[int] = []


@functools.lru_cache(maxsize=None)
def _logged(n: int) -> torch.Tensor:
    _BUILT.append(n)
    return torch.arange(float(n))


class _Logged(Function):
    @staticmethod
    def forward(ctx, x):
        return x * _logged(4)

    @staticmethod
    def backward(ctx, g):
        return g * _logged(4)


def test_a_helper_that_notes_each_table_it_builds():
    matches_eager(_Logged, _args, reset=lambda: (_logged.cache_clear(), _BUILT.clear()),
                  state=lambda: (list(_BUILT), tuple(_logged.cache_info())),
                  between=lambda i: _logged(4).add_(1.0))


class _Tables:
    @classmethod
    @functools.lru_cache(maxsize=None)
    def table(cls, n: int) -> torch.Tensor:
        return torch.arange(float(n))

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def stable(n: int) -> torch.Tensor:
        return torch.arange(float(n)) + 1


class _ClassTables(Function):
    @staticmethod
    def forward(ctx, x):
        return x * _Tables.table(4) * _Tables.stable(4)

    @staticmethod
    def backward(ctx, g):
        return g * _Tables.table(4) * _Tables.stable(4)


def _tables_reset() -> None:
    _Tables.table.__func__.cache_clear()
    _Tables.stable.cache_clear()


def _tables_state() -> Any:
    return tuple(_Tables.table.__func__.cache_info()), tuple(_Tables.stable.cache_info())


def test_classmethod_and_staticmethod_tables_written_before_backward():
    # (a classmethod's key holds the class; read anew, the bound method is a new object each time)
    matches_eager(_ClassTables, _args, reset=_tables_reset, state=_tables_state, refusable=False,
                  mid=lambda i: (_Tables.table(4).add_(1.0), _Tables.stable(4).mul_(2.0)))


@functools.lru_cache(maxsize=None)
def _typed_table(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.arange(n, dtype=dtype)


class _DtypeKeyed(Function):
    @staticmethod
    def forward(ctx, x):
        return x * _typed_table(4, dtype=x.dtype)

    @staticmethod
    def backward(ctx, g):
        return g * _typed_table(4, dtype=g.dtype)


def test_a_table_keyed_by_a_dtype_written_in_place_between_calls():
    # (a dtype is a plain key: the entry is read from the cache)
    matches_eager(_DtypeKeyed, _args, reset=_typed_table.cache_clear, refusable=False,
                  between=lambda i: _typed_table(4, dtype=torch.float32).add_(1.0),
                  state=lambda: tuple(_typed_table.cache_info()))


@functools.lru_cache(maxsize=None)
def _doubled(t: torch.Tensor) -> torch.Tensor:
    return t * 2


_W = torch.ones(4)


class _TensorKeyed(Function):
    @staticmethod
    def forward(ctx, x):
        return x * _doubled(_W)

    @staticmethod
    def backward(ctx, g):
        return g * _doubled(_W)


def test_a_cache_keyed_by_a_global_tensor_written_in_place():
    # Eager's cache keys ``_W`` by identity and keeps what it made from it then; computed in the
    # graphs for this call only, checked against the entry (refused where ``_W`` changed since).
    matches_eager(_TensorKeyed, _args, reset=lambda: (_doubled.cache_clear(), _W.fill_(1.0)),
                  between=lambda i: _W.add_(1.0))
    matches_eager(_TensorKeyed, _args, reset=lambda: (_doubled.cache_clear(), _W.fill_(1.0)),
                  between=lambda i: _doubled(_W).add_(1.0))


class _TwoEntries(Function):
    @staticmethod
    def forward(ctx, x):
        return x * _table(4) + _table(5)[:4]

    @staticmethod
    def backward(ctx, g):
        return g * _table(4) + _table(5)[1:]


def test_two_entries_of_one_helper_are_two_inputs():
    # (both were named ``cached__table``: the graph's code did not compile)
    matches_eager(_TwoEntries, _args, reset=_table.cache_clear, between=lambda i: _table(5).add_(1.0), refusable=False)
    _table.cache_clear()
    names = [s.name for s in minihop.capture(_TwoEntries, _x(0)).inputs]
    assert len(set(names)) == len(names) and "cached__table_4" in names and "cached__table_5" in names, names


# -- wherever the helper is held, the trace never leaves a fake tensor in its cache -----------------

def _lru() -> Any:
    return functools.lru_cache(maxsize=None)(lambda n: torch.arange(float(n)) + 1)


_HELD = {"dict": _lru(), "list": [_lru()], "kw": _lru(), "named": _lru(), "decorated": _lru()}
_NAME = ["_HELD_TABLE"]
_HELD_TABLE = _lru()


def _logged_calls(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*a: Any) -> Any:
        return fn(*a)
    return wrapper


_DECORATED = _logged_calls(_HELD["decorated"])


def _kw_helper(n: int, *, table: Any = _HELD["kw"]) -> torch.Tensor:
    return table(n)


def _named_global(n: int) -> torch.Tensor:
    return getattr(sys.modules[__name__], _NAME[0])(n)


def _calling(read: Any) -> type:
    class Calls(Function):
        @staticmethod
        def forward(ctx, x):
            return x * read(4)

        @staticmethod
        def backward(ctx, g):
            return g * read(4)
    return Calls


@pytest.mark.parametrize("where", ["decorator", "dict", "list", "local_list", "map", "kwdefault", "partial_keyword",
                                   "getattr_by_name", "module_vars"])
def test_a_cold_cache_never_keeps_a_fake_tensor(where: str) -> None:
    # Before: the helper was swapped only where a chain named it (a global, a cell, an
    # attribute); held elsewhere, the trace called it for real on fake tensors, and its cache
    # kept a FakeTensor that the caller's next call got back (.tolist() raised).
    cache, read = {
        "decorator": (_HELD["decorated"], _DECORATED),
        "dict": (_HELD["dict"], lambda n: _HELD["dict"](n)),
        "list": (_HELD["list"][0], lambda n: _HELD["list"][0](n)),
        "local_list": (_HELD["list"][0], lambda n: [_HELD["list"][0]][0](n)),
        "map": (_HELD["list"][0], lambda n: next(map(_HELD["list"][0], [n]))),
        "kwdefault": (_HELD["kw"], _kw_helper),
        "partial_keyword": (_HELD["kw"], functools.partial(_kw_helper, table=_HELD["kw"])),
        "getattr_by_name": (_HELD_TABLE, _named_global),
        "module_vars": (_HELD_TABLE, lambda n: vars(sys.modules[__name__])["_HELD_TABLE"](n)),
    }[where]
    fn = _calling(read)
    cache.cache_clear()
    matches_eager(fn, _args, reset=cache.cache_clear, state=lambda: (type(cache(4)).__name__, cache(4).tolist()))
    assert type(cache(4)) is torch.Tensor


def _positional_default(n: int, table: Any = _HELD_TABLE) -> torch.Tensor:
    return table(n)


@pytest.mark.parametrize("where", ["argument", "positional_default", "partial_argument"])
def test_a_helper_held_where_it_cannot_be_swapped_is_refused(where: str) -> None:
    _HELD_TABLE.cache_clear()
    if where == "argument":
        class ByArgument(Function):
            @staticmethod
            def forward(ctx, x, table):
                return x * table(4)

            @staticmethod
            def backward(ctx, g):
                return g, None
        fn, args = ByArgument, (_x(0), _HELD_TABLE)
    else:
        read = _positional_default if where == "positional_default" else functools.partial(_HELD_TABLE, 4)
        fn, args = _calling(read if where == "positional_default" else (lambda n: read())), (_x(0),)
    with pytest.raises(SideEffectError, match=r"MH106.*calls an lru_cache helper"):
        minihop.capture(fn, *args)
    assert _HELD_TABLE.cache_info().currsize == 0  # (refused before anything ran)
    out = minihop.function(fn, fallback="eager")(*args)
    assert type(_HELD_TABLE(4)) is torch.Tensor and torch.equal(out, fn.apply(*args))


_HASHED = [0]


class _CountedKey:
    def __init__(self, k: int) -> None:
        self.k = k

    def __hash__(self) -> int:
        _HASHED[0] += 1
        return hash(self.k)

    def __eq__(self, other: object) -> bool:
        return type(other) is _CountedKey and other.k == self.k


_KEYED = {_CountedKey(1): 2.0}


class _WarnsBesideATable(Function):
    @staticmethod
    def forward(ctx, x):
        warnings.warn("forward ran")  # (refused: fallback runs eager after the trace)
        return x * _table(4) * _KEYED[_CountedKey(1)]

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_putting_back_what_a_refused_trace_touched_never_hashes_a_users_key():
    # The call watch's copy of ``_KEYED`` (to put back) was rebuilt to swap the helper's
    # stand-in back, hashing every key: the key's own ``__hash__`` ran once more in fallback.
    matches_eager(_WarnsBesideATable, _args, reset=lambda: (_table.cache_clear(), _HASHED.__setitem__(0, 0)),
                  state=lambda: _HASHED[0])


# -- another library's cache: the same protocol, or a proxy that hides its state -----------------

def _cached(fn: Any) -> Any:
    """A cache decorator written as cachetools' is: a ``functools.wraps`` wrapper over a dict,
    with ``cache_clear``."""
    store: dict[Any, Any] = {}

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        if args not in store:
            store[args] = fn(*args)
        return store[args]
    wrapper.cache_clear = store.clear  # type: ignore[attr-defined]
    return wrapper


@_cached
def _dict_cached(n: int) -> torch.Tensor:
    return torch.arange(float(n)) + 1


def test_another_librarys_cache_is_read_as_eager_reads_it():
    fn = _calling(_dict_cached)
    matches_eager(fn, _args, reset=_dict_cached.cache_clear, between=lambda i: _dict_cached(4).add_(1.0),
                  state=lambda: (type(_dict_cached(4)).__name__, _dict_cached(4).tolist()), refusable=False)


class _Proxy:
    """A forwarding proxy as ``wrapt``'s (``wrapt.lru_cache``): its ``__dict__`` is the wrapped
    function's, and its own cache, made on the first call, lives in its slots."""

    __slots__ = ("_fn", "_cache")

    def __init__(self, fn: Any) -> None:
        object.__setattr__(self, "_fn", fn)
        object.__setattr__(self, "_cache", None)

    @property
    def __wrapped__(self) -> Any:
        return self._fn

    @property
    def __dict__(self) -> Any:  # type: ignore[override]
        return self._fn.__dict__

    def __call__(self, *args: Any) -> Any:
        if self._cache is None:
            object.__setattr__(self, "_cache", functools.lru_cache(maxsize=None)(self._fn))
        return self._cache(*args)

    def cache_clear(self) -> None:
        object.__setattr__(self, "_cache", None)


_PROXIED = _Proxy(lambda n: torch.arange(float(n)) + 2)


def test_a_forwarding_proxy_is_refused_before_tracing():
    # Before: traced through, its cache made on the fake call kept a FakeTensor, and putting
    # its "attributes" back wrote into the wrapped function's dict (the caller's next call raised).
    fn = _calling(_PROXIED)
    _PROXIED.cache_clear()
    with pytest.raises(SideEffectError, match=r"MH106.*neither see nor put back"):
        minihop.capture(fn, _x(0))
    assert _PROXIED._cache is None
    matches_eager(fn, _args, reset=_PROXIED.cache_clear, state=lambda: (type(_PROXIED(4)).__name__, _PROXIED(4).tolist()))


# -- what ctx holds, compared deep -------------------------------------------------------------

def _nested(depth: int) -> types.SimpleNamespace:
    node = types.SimpleNamespace(n=1)
    for _ in range(depth):
        node = types.SimpleNamespace(c=node)
    return node


def _bottom(node: types.SimpleNamespace) -> types.SimpleNamespace:
    while hasattr(node, "c"):
        node = node.c
    return node


def _deep_ctx(depth: int) -> type:
    class DeepCtx(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.info = _nested(depth)
            return x * 2.0

        @staticmethod
        def backward(ctx, g):
            leaf = _bottom(ctx.info)
            leaf.n += 1
            return g * leaf.n
    return DeepCtx


def test_backward_changing_an_object_seven_levels_down_on_ctx_twice():
    matches_eager(_deep_ctx(7), _args, backwards=2)


class _Node:
    def __init__(self, parent: Any = None, depth: int = 3) -> None:
        self.parent, self.n = parent, 1
        self.kids = [_Node(self, depth - 1) for _ in range(3)] if depth else []


class _TreeCtx(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.tree = _Node()
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * ctx.tree.kids[0].kids[1].n


def test_a_tree_with_parent_links_on_ctx_read_only_is_captured():
    matches_eager(_TreeCtx, _args, backwards=2, refusable=False)


class _WideCtx(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.items = [types.SimpleNamespace(v=float(k), t=torch.ones(1)) for k in range(3000)]
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * ctx.items[5].v


def test_three_thousand_objects_on_ctx_read_only_are_captured():
    matches_eager(_WideCtx, _args, backwards=2, refusable=False)


def test_deeper_on_ctx_than_is_compared_is_refused_naming_the_budget():
    deeper = _deep_ctx(14)
    matches_eager(deeper, _args, backwards=2)
    with pytest.raises(SideEffectError, match=r"MH106.*may change ctx\.info.*more, or deeper, than minihop compares"):
        minihop.capture(deeper, _x(0))


# -- a setting read with an argument ----------------------------------------------------------

class _AutocastDtype(Function):
    @staticmethod
    def forward(ctx, x):
        return x * (2.0 if torch.get_autocast_dtype("cpu") == torch.float16 else 3.0)

    @staticmethod
    def backward(ctx, g):
        return g * (5.0 if torch.get_autocast_dtype("cpu") == torch.float16 else 7.0)


def test_the_autocast_dtype_read_with_autocast_off_and_set_between_calls():
    matches_eager(_AutocastDtype, _args, refusable=False,
                  between=lambda i: torch.set_autocast_dtype("cpu", [torch.bfloat16, torch.float16][i % 2]),
                  reset=lambda: torch.set_autocast_dtype("cpu", torch.bfloat16))
    torch.set_autocast_dtype("cpu", torch.bfloat16)


def test_the_autocast_dtype_set_before_backward():
    matches_eager(_AutocastDtype, _args,
                  mid=lambda i: torch.set_autocast_dtype("cpu", [torch.bfloat16, torch.float16][i % 2]),
                  reset=lambda: torch.set_autocast_dtype("cpu", torch.bfloat16))
    torch.set_autocast_dtype("cpu", torch.bfloat16)


# -- a lazy module passed in before its first call ----------------------------------------------

class _Layer(Function):
    @staticmethod
    def forward(ctx, x, layer):
        return layer(x)

    @staticmethod
    def backward(ctx, g):
        return g @ torch.ones(3, 4), None


_LAZY: dict[str, Any] = {}


def _fresh_lazy() -> None:
    torch.manual_seed(5)
    _LAZY["m"] = torch.nn.LazyLinear(3)


def test_a_lazy_module_before_its_first_call_is_refused_and_fallback_is_eager():
    matches_eager(_Layer, lambda i: (_x(i).view(1, 4).detach().requires_grad_(), _LAZY["m"]), reset=_fresh_lazy,
                  state=lambda: type(_LAZY["m"].weight).__name__)
    _fresh_lazy()
    with pytest.raises(UnsupportedArgumentError, match=r"MH101.*a LazyLinear, whose parameters are not made yet"):
        minihop.capture(_Layer, torch.ones(1, 4), _LAZY["m"])


# -- a global that is, on some calls, an item of an argument -----------------------------------

_G: list[int] = []
_OTHER: list[int] = []


class _BoxedAppend(Function):
    @staticmethod
    def forward(ctx, x, box):
        box[0].append(1)
        return x * float(len(_G) + 1)

    @staticmethod
    def backward(ctx, g):
        return g * float(len(_G) + 1), None


@pytest.mark.parametrize("first", ["other", "global"])
def test_a_global_that_is_an_item_of_an_argument_on_some_calls(first: str):
    order = [_OTHER, _G] if first == "other" else [_G, _OTHER]
    matches_eager(_BoxedAppend, lambda i: (_x(i), [order[i % 2]]), reset=lambda: (_G.clear(), _OTHER.clear()),
                  state=lambda: (len(_G), len(_OTHER)))
