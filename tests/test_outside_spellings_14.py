"""Hostile spellings, round 14 (issue #28, round 19): where a value lives farther than the
analysis walks, and what the trace leaves behind in process state, tried from outside against
eager in strict, apply and fallback mode (``eager_modes.matches_eager``).

Differences from eager before this round:

- a tensor backward reads four steps below a global (``BIG["a"]["b"]["c"][0]``,
  ``REG.layers[2].sub.w``, ``dig(BIG, PATH)``), rebound between forward and ``.backward()``:
  the routes that fetch such a tensor again when backward runs went three containers deep, so
  backward used the tensor forward saw, in every mode (nothing refused). The walk now goes as
  deep as a budget of containers allows (``routes._add_routes``); where it stops, or where a
  tensor the heap walk reached outside the arguments has no route, backward's read is refused
  (``BackwardReads.lift``);
- a backward reading a list at two positions (``L[0] + L[-1]``) beside another tensor, the list
  grown at the front before ``.backward()``: backward traced again for the call took the
  captured tensor of a position the list no longer had (the capture's own trace had made fakes
  for every route it passed on, ``BackwardReads.pass_all``, and kept them), and the graph got
  None: a ``TypeError`` in backward, in fallback mode too. A backward traced again starts
  with no fake of the capture's;
- a tensor seven lists deep in an argument that forward keeps on ctx, replaced before
  ``.backward()``: backward read the caller's container anew only four levels down
  (``backward_reads._index``), below that forward's copy. It follows the copies
  ``replace_tensors`` made now, as deep as they go;
- a tensor in a ``collections.deque`` (``HIST[-1]``) read by backward: not walked at all
  (single-use, but backward used forward's tensor when the deque was appended to before
  ``.backward()``). A deque is walked as a list is;
- a global list read at two positions (``L[0]`` and ``L[-1]``), an item inserted before
  ``.backward()``: backward's route to ``L[0]`` checks the list's length, found it changed, and
  backward was traced again, but with the captured route, so the graph got None: a
  ``TypeError`` in backward, in fallback mode too. A variant whose place reads another tensor
  now gets that place of its own;
- ``jvp(grad(f))``, ``hessian`` and ``jacfwd(jacrev(f))``: functorch's forward-mode level is
  not ``forward_ad``'s, so the call was not seen as forward-mode: torch's
  ``NotImplementedError`` (the capture has no jvp), in fallback mode too, where eager runs the
  user's jvp. Any functorch jvp transform active at the call is refused now (fallback: eager);
- a C++ warning given while the trace runs (``torch.range``'s deprecation) under the
  ``"default"`` filter: the trace ran it under an "ignore" filter, which in C notes it as given
  in the module's ``__warningregistry__``, so eager's run after a refusal gave it no more
  (fallback lost it). What ``warnings`` notes as given is put back when the trace ends
  (``messages.MessageWatch``);
- a ``functools.cache`` helper returning a config dict (``get_config()["scale"]``) that the
  caller changes in place: the trace bypasses the cache (so that it never keeps a fake
  tensor) and read a fresh dict, baked into the capture, in strict mode silently. Where such a
  helper returns a mutable object without tensors, the cache's own entry is fetched now and
  compared (a difference is refused) and the capture is single-use
  (``tracer/cache_entries.py``). Its first fuzz run found an older leak: a trace refused
  while a helper's name was bound to minihop's stand-in (the uncached helper) left it bound,
  because the call watch kept the name's value as it then was, and put that back
  (``identity.SWAPPED_IN``: it keeps the user's function);
- an object with a ``__del__`` of the user's kept on ctx three or more containers down
  (``ctx.held = {"k": {"k": {"k": Dying()}}}``), or returned five lists down: the walk of what
  ctx keeps and forward returns stopped three levels down, so the capture's template kept it
  alive (eager's dies with each call's graph) and a refused trace's one died after minihop put
  the caller's state back (fallback counted one death more). The walk goes as deep as a budget
  of 4,096 containers allows, and past it assumes nothing (``death_code.held_first``), and
  enters a ``SimpleNamespace`` (a library holder of the user's values; found by the effects
  generator's round-19 kinds);
- an iterator seven or more lists deep in an argument, or three lists below the global
  container a chain ends at (``next(innermost(ITERATORS["n"]))``): the walk that refuses
  iterators before the trace stopped at six levels (two below a chain's end), so the trace took
  a value from it that no refusal gives back (fallback's first call differed). The walk goes as
  deep as a budget of 20,000 containers allows, past which it refuses (``iterators._find``);
- a helper six calls down writing into a ``SimpleNamespace`` log, then a refusal (a
  ``print``): the analysis followed helpers three calls deep, and the call watch that keeps what
  unanalysed code may write (so that a refused trace puts it back) kept two levels below a
  global and no library holder's attributes, so fallback's eager run wrote the line a second
  time. Helpers are analysed twelve calls deep (up to 512 functions, ``roots.analysed``), and the
  call watch keeps eight levels down, a ``SimpleNamespace``'s attributes too;
- a tensor a module holds as a plain attribute (``self.mask = t``, or in a dict of tables),
  replaced before ``.backward()``, the module a global or an argument kept on ctx: routes and
  argument paths knew a module's parameters and buffers only, so backward used forward's tensor.
  They know its modules' plain tensor attributes too (``routes.module_tensors``);
- a tensor forward returns that it neither made nor was given (``return y, BUF``), and
  ``torch.range``/``torch.Tensor(n)`` (which skip torch function modes): refused with a message
  about fake tensors "from another capture" and "pass real tensors", which the user never
  had. Each now says what was found and what to do.

The other cases are new spellings of the issue's classes that already matched eager and stay as
cases the suite had not seen: ABC registration and ``singledispatch`` registration between
calls, a ``runtime_checkable`` Protocol whose object gains an attribute, a metaclass
``__instancecheck__``, ``__class__``/``__bases__``/``__code__``/``__defaults__`` swapped, a
local ``from cfg import K``, ``globals()["K"]``, a name served by ``builtins``, objects passed
whose ``__getattr__``/``__index__``/``__bool__`` read a global, generator helpers, singletons made
by a metaclass or ``__new__``, and deep helper chains.
"""

from __future__ import annotations

import abc
import builtins
import collections
import functools
import gc
import itertools
import sys
import types
import typing
import warnings

import pytest
import torch
import torch.func as tf
import torch.nn.functional as TF

import minihop

from eager_modes import caller, matches_eager


def x_(i):
    return (torch.linspace(-1, 1, 4) + i).requires_grad_()


# -- tensors backward reads far below a global -------------------------------------------------

BIG = {"a": {"b": {"c": [torch.ones(4)]}}}


def _deep_list():
    return BIG["a"]["b"]["c"]


class FourStepsDown(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * BIG["a"]["b"]["c"][0]

    @staticmethod
    def backward(ctx, g):
        return g * BIG["a"]["b"]["c"][0]


def _reset_big():
    _deep_list()[:] = [torch.ones(4)]


def test_a_tensor_four_steps_below_a_global_rebound_before_backward():
    def mid(i):
        _deep_list()[0] = torch.full((4,), 5.0 + i)
    matches_eager(FourStepsDown, lambda i: (x_(i),), mid=mid, reset=_reset_big, refusable=False)


def test_a_tensor_four_steps_below_a_global_rebound_between_calls():
    def between(i):
        _deep_list()[0] = torch.full((4,), 2.0 + i)
    matches_eager(FourStepsDown, lambda i: (x_(i),), between=between, reset=_reset_big, refusable=False)


def dig(d, path):
    for p in path:
        d = d[p]
    return d


PATH = ["a", "b", "c", 0]


class ComputedPath(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * dig(BIG, PATH)

    @staticmethod
    def backward(ctx, g):
        return g * dig(BIG, PATH)


def test_a_tensor_reached_by_a_computed_path_rebound_before_backward():
    def mid(i):
        _deep_list()[0] = torch.full((4,), 5.0 + i)
    matches_eager(ComputedPath, lambda i: (x_(i),), mid=mid, reset=_reset_big)


class Holder:
    pass


REG = Holder()
REG.layers = [Holder() for _ in range(3)]
for _layer in REG.layers:
    _layer.sub = Holder()
    _layer.sub.w = torch.ones(4)


class ObjectAttributes(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * REG.layers[2].sub.w

    @staticmethod
    def backward(ctx, g):
        return g * REG.layers[2].sub.w


def test_a_tensor_attribute_of_objects_in_a_list_rebound_before_backward():
    def mid(i):
        REG.layers[2].sub.w = torch.full((4,), 3.0 + i)
    matches_eager(ObjectAttributes, lambda i: (x_(i),), mid=mid,
                  reset=lambda: setattr(REG.layers[2].sub, "w", torch.ones(4)), refusable=False)


def _nest(depth: int) -> dict:
    out: dict = {"w": torch.ones(4)}
    for _ in range(depth):
        out = {"k": out}
    return out


DEEPER = _nest(40)


def _deeper_leaf() -> dict:
    d = DEEPER
    while "k" in d:
        d = d["k"]
    return d


class PastTheWalk(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * _deeper_leaf()["w"]


def test_a_tensor_past_where_the_walk_stops_is_refused_in_backward():
    with pytest.raises(minihop.MinihopError, match=r"MH104.*backward reads a tensor held outside its arguments"):
        y = minihop.function(PastTheWalk)(x_(0))
        y.sum().backward()

    def mid(i):
        _deeper_leaf()["w"] = torch.full((4,), 3.0 + i)
    matches_eager(PastTheWalk, lambda i: (x_(i),), mid=mid, reset=lambda: _deeper_leaf().__setitem__("w", torch.ones(4)))


HIST = collections.deque([torch.ones(4)], maxlen=3)


class DequeLast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * HIST[-1]

    @staticmethod
    def backward(ctx, g):
        return g * HIST[-1]


def _reset_hist():
    HIST.clear()
    HIST.append(torch.ones(4))


def test_a_deque_appended_to_before_backward():
    matches_eager(DequeLast, lambda i: (x_(i),), mid=lambda i: HIST.append(torch.full((4,), 3.0 + i)),
                  reset=_reset_hist, refusable=False)


def test_a_deque_appended_to_between_calls():
    matches_eager(DequeLast, lambda i: (x_(i),), between=lambda i: HIST.append(torch.full((4,), 3.0 + i)),
                  reset=_reset_hist, refusable=False)


PAIR = [torch.ones(4), torch.ones(4) * 2]


class TwoPositions(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * PAIR[0] + PAIR[-1]

    @staticmethod
    def backward(ctx, g):
        return g * PAIR[0]


def _reset_pair():
    PAIR[:] = [torch.ones(4), torch.ones(4) * 2]


def test_an_item_inserted_before_backward_moves_the_position_backward_reads():
    matches_eager(TwoPositions, lambda i: (x_(i),), mid=lambda i: PAIR.insert(0, torch.full((4,), 3.0 + i)),
                  reset=_reset_pair, refusable=False)


def test_a_list_whose_length_differs_at_each_backward():
    def between(i):
        del PAIR[:-2]

    def mid(i):
        for _ in range(i % 3 + 1):
            PAIR.insert(0, torch.full((4,), 3.0 + i))
    matches_eager(TwoPositions, lambda i: (x_(i),), between=between, mid=mid, reset=_reset_pair, steps=7)


FRONT = [torch.ones(()), torch.ones(())]
TABLE = {"a": {"b": {"c": [torch.ones(())]}}}


def _table_part(scale):
    return scale * TABLE["a"]["b"]["c"][0]


TABLE_PART = functools.partial(_table_part, 1.0)


class FrontAndTable(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        return g * (FRONT[0] + 0.5 * FRONT[-1]) * TABLE_PART()


class FrontAndShallowTable(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        return g * (FRONT[0] + 0.5 * FRONT[-1]) * TABLE["a"]["b"]["c"][0]


@pytest.mark.parametrize("fn", [FrontAndTable, FrontAndShallowTable])
def test_a_list_growing_at_the_front_beside_another_tensor_backward_reads(fn):
    def change(i):
        FRONT.insert(0, torch.full((), 0.5 * i))
        TABLE["a"]["b"]["c"][0] = torch.full((), 1.0 + i)

    def reset():
        FRONT[:] = [torch.ones(()), torch.ones(())]
        TABLE["a"]["b"]["c"][0] = torch.ones(())
    matches_eager(fn, lambda i: (torch.linspace(-1, 1.5, 3, requires_grad=True),), between=change, mid=change,
                  reset=reset, refusable=False)


def _nested_list(depth: int, leaf):
    out = [leaf]
    for _ in range(depth):
        out = [out]
    return out


def _innermost(held):
    while type(held[0]) is list:
        held = held[0]
    return held


class NestedArgumentOnCtx(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, nested):
        ctx.nested = nested
        return x * _innermost(nested)[0]

    @staticmethod
    def backward(ctx, g):
        return g * _innermost(ctx.nested)[0], None


@pytest.mark.parametrize("depth", [2, 6, 12])
def test_a_tensor_deep_in_an_argument_kept_on_ctx_rebound_before_backward(depth):
    nested = _nested_list(depth, torch.ones(4))
    matches_eager(NestedArgumentOnCtx, lambda i: (x_(i), nested), refusable=False,
                  mid=lambda i: _innermost(nested).__setitem__(0, torch.full((4,), 3.0 + i)),
                  reset=lambda: _innermost(nested).__setitem__(0, torch.ones(4)))


@functools.cache
def get_config():
    return {"scale": 2.0}


class CachedConfig(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * get_config()["scale"]

    @staticmethod
    def backward(ctx, g):
        return g * get_config()["scale"]


@pytest.mark.parametrize("when", ["between", "mid"])
def test_a_cached_config_dict_changed_by_the_caller(when):
    change = {when: lambda i: get_config().__setitem__("scale", 2.0 + i)}
    matches_eager(CachedConfig, lambda i: (x_(i),), reset=get_config.cache_clear, **change)


def _config_leaf():
    return get_config()["scale"]


def _config_helper():
    return _config_leaf()


def _times_config(fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        return fn(*a, **k) * _config_helper()
    return wrapper


class DecoratedBackwardReadsConfig(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    @_times_config
    def backward(ctx, g):
        return g


def test_a_refused_trace_leaves_the_cached_helper_bound_as_it_was():
    def change(i):
        get_config()["scale"] = 0.5 + i
    matches_eager(DecoratedBackwardReadsConfig, lambda i: (x_(i),), between=change, mid=change,
                  reset=get_config.cache_clear)
    assert type(get_config) is type(functools.cache(lambda: None))  # (the user's, not a stand-in)


def test_a_cached_config_dict_changed_before_the_first_call_is_refused():
    get_config.cache_clear()
    get_config()["scale"] = 5.0
    with pytest.raises(minihop.MinihopError, match=r"MH106.*get_config.*was changed since its cache made it"):
        minihop.function(CachedConfig)(x_(0))
    x = x_(0)
    out = minihop.function(CachedConfig, fallback="eager")(x)
    torch.testing.assert_close(out, x.detach() * 5.0)
    get_config.cache_clear()


class Dying:
    """Counts its own deaths (code of the user's run when the object dies)."""

    deaths: list[int] = []

    def __del__(self):
        Dying.deaths.append(1)


def _deaths():
    gc.collect()
    return len(Dying.deaths)


def _no_deaths():
    gc.collect()
    Dying.deaths.clear()


def _keeps_deep(depth: int, as_objects: bool) -> type:
    class KeepsDeep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            held = Dying()
            for _ in range(depth):
                if as_objects:
                    box = Holder()
                    box.inner = held
                    held = box
                else:
                    held = {"k": held}
            ctx.held = held
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2
    return KeepsDeep


@pytest.mark.parametrize("depth,as_objects", [(3, False), (6, False), (6, True)])
def test_an_object_with_death_code_kept_deep_on_ctx(depth, as_objects):
    matches_eager(_keeps_deep(depth, as_objects), lambda i: (x_(i),), state=_deaths, reset=_no_deaths)


class KeepsInANamespace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        ctx.kept = types.SimpleNamespace(a=types.SimpleNamespace(b=[{"d": Dying()}]))
        return g * 2


def test_an_object_with_death_code_kept_in_a_namespace_on_ctx_by_backward():
    matches_eager(KeepsInANamespace, lambda i: (x_(i),), state=_deaths, reset=_no_deaths)


class ReturnsDeep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        held = Dying()
        for _ in range(5):
            held = [held]
        return x * 2, held

    @staticmethod
    def backward(ctx, g, gh):
        return g * 2


def test_an_object_with_death_code_returned_deep():
    deaths = {}
    for mode in ("eager", "strict", "fallback"):
        _no_deaths()
        call = caller(mode, ReturnsDeep)
        seen = []
        for i in range(3):
            try:
                y, held = call(x_(i))
            except minihop.MinihopError:
                assert mode == "strict"
                seen.append("refused")
                continue
            del held
            y.sum().backward()
            del y
            seen.append(_deaths())
        deaths[mode] = seen
    assert deaths["fallback"] == deaths["eager"], deaths
    assert deaths["strict"] in (deaths["eager"], ["refused"] * 3), deaths


def _nested_iterator(depth: int):
    held = itertools.count(1)
    for _ in range(depth):
        held = [held]
    return held


def _innermost_item(held):
    while type(held) is list:
        held = held[0]
    return held


class NextOfNestedArgument(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, nested):
        return x * next(_innermost_item(nested))

    @staticmethod
    def backward(ctx, g):
        return g, None


ITERATORS: dict = {}


class NextOfNestedGlobal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * next(_innermost_item(ITERATORS["n"]))

    @staticmethod
    def backward(ctx, g):
        return g


@pytest.mark.parametrize("depth", [3, 8, 20])
def test_an_iterator_nested_deep_in_an_argument(depth):
    holder = {}

    def reset():
        holder["n"] = _nested_iterator(depth)
    reset()
    matches_eager(NextOfNestedArgument, lambda i: (x_(i), holder["n"]), reset=reset)


@pytest.mark.parametrize("depth", [3, 8])
def test_an_iterator_nested_in_a_global_the_code_hands_to_a_helper(depth):
    matches_eager(NextOfNestedGlobal, lambda i: (x_(i),), reset=lambda: ITERATORS.__setitem__("n", _nested_iterator(depth)))


WRITES = types.SimpleNamespace(a=types.SimpleNamespace(b=types.SimpleNamespace(c=types.SimpleNamespace(lines=[]))))


def _helper_chain(length: int):
    """``g0`` calling ``g1`` ... calling ``g{length}``, which appends to ``WRITES.a.b.c.lines``."""
    space = {"WRITES": WRITES, "__name__": f"helper_chain_{length}"}
    source = f"def g{length}(x):\n    WRITES.a.b.c.lines.append('deep')\n    return x * 2\n"
    for k in range(length - 1, -1, -1):
        source += f"def g{k}(x):\n    return g{k + 1}(x)\n"
    exec(source, space)
    return space["g0"]


def _refused_after_a_deep_write(length: int) -> type:
    helper = _helper_chain(length)

    class WritesThenPrints(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = helper(x)
            print("refused here: a message minihop does not repeat")
            return y

        @staticmethod
        def backward(ctx, g):
            return g * 2
    return WritesThenPrints


@pytest.mark.parametrize("length", [6, 16])
def test_a_helper_far_down_the_calls_writes_before_a_refusal(length):
    matches_eager(_refused_after_a_deep_write(length), lambda i: (x_(i),),
                  state=lambda: list(WRITES.a.b.c.lines), reset=WRITES.a.b.c.lines.clear)


class Masked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.mask = torch.ones(4)  # (a plain attribute: neither parameter nor buffer)
        self.tables = {"w": torch.ones(4)}


MASKED = Masked()


class GlobalModuleMask(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * MASKED.mask * MASKED.tables["w"]

    @staticmethod
    def backward(ctx, g):
        return g * MASKED.mask * MASKED.tables["w"]


class ArgumentModuleMask(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, module):
        ctx.module = module
        return x * module.mask

    @staticmethod
    def backward(ctx, g):
        return g * ctx.module.mask, None


def _reset_masked():
    MASKED.mask = torch.ones(4)
    MASKED.tables["w"] = torch.ones(4)


@pytest.mark.parametrize("when", ["between", "mid"])
def test_a_global_modules_plain_tensor_attributes(when):
    def change(i):
        MASKED.mask = torch.full((4,), 3.0 + i)
        MASKED.tables["w"] = torch.full((4,), 0.5 + i)
    matches_eager(GlobalModuleMask, lambda i: (x_(i),), reset=_reset_masked, refusable=False, **{when: change})


@pytest.mark.parametrize("when", ["between", "mid"])
def test_a_module_arguments_plain_tensor_attribute_kept_on_ctx(when):
    matches_eager(ArgumentModuleMask, lambda i: (x_(i), MASKED), reset=_reset_masked, refusable=False,
                  **{when: lambda i: setattr(MASKED, "mask", torch.full((4,), 3.0 + i))})


# -- functorch's forward mode -------------------------------------------------------------------

class SinWithJvp(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return x.sin() * 2

    @staticmethod
    def setup_context(ctx, inputs, output):
        (x,) = inputs
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos() * 2

    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return t * x.cos() * 2


class SinWithoutJvp(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return x.sin() * 2

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos() * 2


TRANSFORMS = {
    "hessian": lambda call, x: tf.hessian(lambda t: call(t).sum())(x),
    "jacfwd_of_jacrev": lambda call, x: tf.jacfwd(tf.jacrev(lambda t: call(t).sum()))(x),
    "jvp_of_grad": lambda call, x: tf.jvp(tf.grad(lambda t: call(t).sum()), (x,), (torch.ones_like(x),))[1],
    "jacfwd": lambda call, x: tf.jacfwd(call)(x),
}


def _outcome(fn: type, mode: str, transform: str) -> tuple:
    x = torch.linspace(-1, 1, 3)
    try:
        return ("value", TRANSFORMS[transform](caller(mode, fn), x))
    except minihop.MinihopError as e:
        return ("refused", str(e).splitlines()[0])
    except Exception as e:  # eager's own error, which fallback must give as it is
        return (type(e).__name__, str(e).splitlines()[0])


@pytest.mark.parametrize("transform", sorted(TRANSFORMS))
@pytest.mark.parametrize("fn", [SinWithJvp, SinWithoutJvp], ids=["with_jvp", "without_jvp"])
def test_functorch_forward_mode_over_the_call(fn, transform):
    eager = _outcome(fn, "eager", transform)
    for mode in ("strict", "apply"):
        got = _outcome(fn, mode, transform)
        assert got[0] == "refused" and "MH104" in got[1] and "dual tensor" in got[1], (mode, got)
    got = _outcome(fn, "fallback", transform)
    assert got[0] == eager[0], (got, eager)
    if eager[0] == "value":
        torch.testing.assert_close(got[1], eager[1], rtol=0, atol=0)
    else:
        assert got == eager


# -- what warnings note as given ----------------------------------------------------------------

class RangeDeprecation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * torch.range(1, 4)

    @staticmethod
    def backward(ctx, g):
        return g * torch.range(1, 4)


class CopyConstruct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * x.new_tensor(x.detach())

    @staticmethod
    def backward(ctx, g):
        return g


def _warned(fn: type, mode: str, action: str) -> tuple:
    sys.modules[__name__].__dict__.pop("__warningregistry__", None)
    call = caller(mode, fn)
    grads = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter(action)
        for i in range(3):
            x = x_(i)
            try:
                call(x).sum().backward()
            except minihop.MinihopError:
                return ("refused",)
            grads.append(x.grad.tolist())
    return grads, [(str(w.message)[:40], w.lineno) for w in caught if not str(w.message).startswith("minihop")]


@pytest.mark.parametrize("action", ["default", "module", "once", "always"])
@pytest.mark.parametrize("fn", [RangeDeprecation, CopyConstruct], ids=["range", "new_tensor"])
def test_a_warning_the_trace_ran_is_given_by_eager_as_often(fn, action):
    eager = _warned(fn, "eager", action)
    for mode in ("strict", "apply", "fallback"):
        got = _warned(fn, mode, action)
        if got == ("refused",) and mode != "fallback":
            continue
        assert got == eager, (mode, got, eager)


# -- refusals that name what was found -----------------------------------------------------------

BUF = torch.ones(4)


class ReturnsGlobal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2, BUF

    @staticmethod
    def backward(ctx, g, gb):
        return g * 2


class ReturnsGlobalInList(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * BUF, [BUF]

    @staticmethod
    def backward(ctx, g, gb):
        return g * BUF


@pytest.mark.parametrize("fn", [ReturnsGlobal, ReturnsGlobalInList])
def test_a_returned_tensor_held_outside_is_refused_by_name(fn):
    with pytest.raises(minihop.MinihopError, match=r"MH102.*returns a tensor it neither made nor was given \(the global BUF\)"):
        minihop.function(fn)(x_(0))
    out = minihop.function(fn, fallback="eager")(x_(0))
    held = out[1] if fn is ReturnsGlobal else out[1][0]
    assert held is BUF  # (eager's: the very tensor)


class LegacyConstructor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * torch.Tensor(4).fill_(2.0)

    @staticmethod
    def backward(ctx, g):
        return g * 2


@pytest.mark.parametrize("fn", [RangeDeprecation, LegacyConstructor])
def test_a_torch_call_the_recorder_does_not_see_is_refused_by_what_it_is(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(minihop.MinihopError, match=r"MH104.*made by a torch call that minihop's recorder does not see"):
            minihop.function(fn)(x_(0))
        matches_eager(fn, lambda i: (x_(i),))


# -- new spellings that matched eager already ----------------------------------------------------

class Marker(abc.ABC):
    pass


class Plain:
    pass


PLAIN = Plain()


class AbcQuestion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * (3.0 if isinstance(PLAIN, Marker) else 1.0)

    @staticmethod
    def backward(ctx, g):
        return g


def test_an_abc_registration_between_calls():
    matches_eager(AbcQuestion, lambda i: (x_(i),), between=lambda i: i == 2 and Marker.register(Plain),
                  reset=lambda: (Marker._abc_registry_clear(), Marker._abc_caches_clear()))


@functools.singledispatch
def factor(o):
    return 1.0


class Tag:
    pass


TAG = Tag()


class Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * factor(TAG)

    @staticmethod
    def backward(ctx, g):
        return g


def _unregister_tag():
    for cell in factor.register.__closure__:
        held = cell.cell_contents
        if type(held) is dict and Tag in held:
            del held[Tag]
        if type(held).__name__ == "WeakKeyDictionary":
            held.clear()


def test_a_singledispatch_registration_between_calls():
    matches_eager(Dispatch, lambda i: (x_(i),), between=lambda i: i == 2 and factor.register(Tag, lambda o: 4.0),
                  reset=_unregister_tag)


@typing.runtime_checkable
class HasScale(typing.Protocol):
    scale: float


class ProtocolQuestion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h):
        return x * (2.0 if isinstance(h, HasScale) else 3.0)

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_a_protocol_question_of_an_object_that_gains_an_attribute():
    h = Holder()

    def between(i):
        if i % 2:
            h.scale = 1.0
        elif hasattr(h, "scale"):
            del h.scale
    matches_eager(ProtocolQuestion, lambda i: (x_(i), h), between=between)


ON = [True]


class Answering(type):
    def __instancecheck__(cls, obj):
        return ON[0]


class Special(metaclass=Answering):
    pass


class MetaclassQuestion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * (2.0 if isinstance(1, Special) else 3.0)

    @staticmethod
    def backward(ctx, g):
        return g


def test_a_metaclass_instancecheck_reading_a_global():
    matches_eager(MetaclassQuestion, lambda i: (x_(i),), between=lambda i: ON.__setitem__(0, i % 2 == 0),
                  reset=lambda: ON.__setitem__(0, True))


def act(x):
    return x * 2


def _act3(x):
    return x * 3


ACT_CODE = act.__code__


class CodeSwapped(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return act(x)

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_a_helpers_code_swapped_between_calls():
    matches_eager(CodeSwapped, lambda i: (x_(i),), between=lambda i: setattr(act, "__code__", _act3.__code__ if i % 2 else ACT_CODE),
                  reset=lambda: setattr(act, "__code__", ACT_CODE))


def scale_of(s=2.0):
    return s


class DefaultsSwapped(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * scale_of()

    @staticmethod
    def backward(ctx, g):
        return g * scale_of()


@pytest.mark.parametrize("when", ["between", "mid"])
def test_a_helpers_defaults_swapped(when):
    change = {when: lambda i: setattr(scale_of, "__defaults__", (3.0 + i,))}
    matches_eager(DefaultsSwapped, lambda i: (x_(i),), reset=lambda: setattr(scale_of, "__defaults__", (2.0,)), **change)


class First:
    def k(self):
        return 2.0


class Second:
    def k(self):
        return 3.0


SWAPPED = First()


class ClassReassigned(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, o):
        return x * o.k()

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_an_arguments_class_reassigned_between_calls():
    matches_eager(ClassReassigned, lambda i: (x_(i), SWAPPED), between=lambda i: setattr(SWAPPED, "__class__", Second if i % 2 else First),
                  reset=lambda: setattr(SWAPPED, "__class__", First))


class Kid(First):
    pass


KID = Kid()


class BasesSwapped(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * KID.k()

    @staticmethod
    def backward(ctx, g):
        return g


def test_a_classes_bases_swapped_between_calls():
    matches_eager(BasesSwapped, lambda i: (x_(i),), between=lambda i: setattr(Kid, "__bases__", (Second,) if i % 2 else (First,)),
                  reset=lambda: setattr(Kid, "__bases__", (First,)))


CFG_MODULE = types.ModuleType("minihop_probe_cfg_14")
CFG_MODULE.SCALE = 2.0
sys.modules["minihop_probe_cfg_14"] = CFG_MODULE


class LocalImport(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        from minihop_probe_cfg_14 import SCALE
        return x * SCALE

    @staticmethod
    def backward(ctx, g):
        from minihop_probe_cfg_14 import SCALE
        return g * SCALE


@pytest.mark.parametrize("when", ["between", "mid"])
def test_a_local_import_of_a_changed_name(when):
    change = {when: lambda i: setattr(CFG_MODULE, "SCALE", 3.0 + i)}
    matches_eager(LocalImport, lambda i: (x_(i),), reset=lambda: setattr(CFG_MODULE, "SCALE", 2.0), **change)


SCALE = 2.0


class GlobalsDict(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * globals()["SCALE"]

    @staticmethod
    def backward(ctx, g):
        return g * globals().get("SCALE", 1.0)


@pytest.mark.parametrize("when", ["between", "mid"])
def test_globals_read_by_subscript(when):
    change = {when: lambda i: globals().__setitem__("SCALE", 3.0 + i)}
    matches_eager(GlobalsDict, lambda i: (x_(i),), reset=lambda: globals().__setitem__("SCALE", 2.0), **change)


builtins.MINIHOP_PROBE_14 = 2.0


class FromBuiltins(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * MINIHOP_PROBE_14  # noqa: F821 - served by builtins, as line_profiler's ``profile``

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_a_name_served_by_builtins_changed_then_shadowed():
    def between(i):
        builtins.MINIHOP_PROBE_14 = 2.0 + i
        if i == 3:
            globals()["MINIHOP_PROBE_14"] = 9.0

    def reset():
        builtins.MINIHOP_PROBE_14 = 2.0
        globals().pop("MINIHOP_PROBE_14", None)
    matches_eager(FromBuiltins, lambda i: (x_(i),), between=between, reset=reset)


DEFAULTS = {"scale": 2.0}


class Lazy:
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return DEFAULTS[name]


class GetattrFallback(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cfg):
        return x * cfg.scale

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_an_arguments_getattr_fallback_reading_a_global():
    lazy = Lazy()
    matches_eager(GetattrFallback, lambda i: (x_(i), lazy), between=lambda i: DEFAULTS.__setitem__("scale", 2.0 + i),
                  reset=lambda: DEFAULTS.__setitem__("scale", 2.0))


class SingletonMeta(type):
    made: dict = {}

    def __call__(cls, *a, **k):
        if cls not in cls.made:
            cls.made[cls] = super().__call__(*a, **k)
        return cls.made[cls]


class Settings(metaclass=SingletonMeta):
    def __init__(self):
        self.scale = 2.0


class SingletonRead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * Settings().scale

    @staticmethod
    def backward(ctx, g):
        return g * Settings().scale


@pytest.mark.parametrize("when", ["between", "mid"])
def test_a_singleton_made_by_a_metaclass(when):
    change = {when: lambda i: setattr(Settings(), "scale", 3.0 + i)}
    matches_eager(SingletonRead, lambda i: (x_(i),), reset=lambda: setattr(Settings(), "scale", 2.0), **change)


CO = Holder()
CO.a, CO.b = 2.0, 3.0


def scales():
    yield CO.a
    yield CO.b


class GeneratorHelper(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        a, b = scales()
        return x * a + b

    @staticmethod
    def backward(ctx, g):
        return g * CO.a


@pytest.mark.parametrize("when", ["between", "mid"])
def test_a_generator_helper_reading_an_object(when):
    change = {when: lambda i: setattr(CO, "a", 3.0 + i)}
    matches_eager(GeneratorHelper, lambda i: (x_(i),), reset=lambda: setattr(CO, "a", 2.0), **change)


K = {"k": 2.0}
T = torch.linspace(1, 2, 4)


def h6(x):
    return x * K["k"] + T


def h5(x):
    return h6(x)


def h4(x):
    return h5(x)


def h3(x):
    return h4(x)


def h2(x):
    return h3(x)


def h1(x):
    return h2(x)


class DeepHelpers(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return h1(x)

    @staticmethod
    def backward(ctx, g):
        return h1(g) - T


def _rebind_t(value):
    global T
    T = value


@pytest.mark.parametrize("when", ["between", "mid"])
def test_helpers_six_calls_deep(when):
    def change(i):
        K["k"] = 3.0 + i
        _rebind_t(torch.linspace(1, 3 + i, 4))

    def reset():
        K["k"] = 2.0
        _rebind_t(torch.linspace(1, 2, 4))
    matches_eager(DeepHelpers, lambda i: (x_(i),), reset=reset, **{when: change})


class UsesRelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return TF.relu(x) * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_a_library_function_rebound_by_the_caller():
    relu = TF.relu
    try:
        matches_eager(UsesRelu, lambda i: (x_(i),), between=lambda i: setattr(TF, "relu", torch.tanh if i % 2 else relu))
    finally:
        TF.relu = relu


def test_a_trace_gives_no_module_a_warnings_registry_of_its_own():
    """A trace that gives no warning leaves the user's module as eager's call does: without a
    ``__warningregistry__`` it did not have (the registries' snapshot made none)."""
    space = {"__name__": "minihop_probe_registry_14", "torch": torch}
    exec("class Plain(torch.autograd.Function):\n"
         "    @staticmethod\n"
         "    def forward(ctx, x):\n        return x * 2\n"
         "    @staticmethod\n"
         "    def backward(ctx, g):\n        return g * 2\n", space)
    minihop.function(space["Plain"])(x_(0)).sum().backward()
    assert "__warningregistry__" not in space
