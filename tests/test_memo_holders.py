"""Memos forward fills and backward reads, crossed: holders (a dict, a nested dict, a
``SimpleNamespace``, a user object, a list, the Function class) × how backward reads them
(an item or attribute, ``pop``, read then ``del``, ``get``/``getattr`` with a default, ``pop``
with a default) × what the caller does between forward and ``.backward()`` (nothing, empties
the holder, puts its own tensor there).

Each case runs eagerly and in strict, apply and fallback mode (``eager_modes.matches_eager``):
outputs, every ``.grad`` and the holder's contents after every call equal eager's, or strict
refuses with a coded error; fallback always equals eager. Found by this crossing: ``pop``
and ``getattr(S, "k", None)`` read forward's tensor whatever the caller did; read-then-``del``
raised MH104 in fallback mode; a memo on a class made by ``exec`` kept a fake tensor.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest
import torch

import eager_modes


class Holder:
    """A user's plain object (``self.k = ...`` from outside)."""


# name -> (setup, forward's store, {form: backward's read into ``t``}, state, clear, replace)
HOLDERS: dict[str, tuple[str, str, dict[str, str], str, str, str]] = {
    "dict": ("M = {}", "M['k'] = v",
             {"item": "t = M['k']", "pop": "t = M.pop('k')", "item_del": "t = M['k']; del M['k']",
              "get": "t = M.get('k', None)", "pop_default": "t = M.pop('k', None)"},
             "sorted((k, x.tolist()) for k, x in M.items())", "M.clear()", "M['k'] = w"),
    "nested": ("M = {'a': {}}", "M['a']['k'] = v",
               {"item": "t = M['a']['k']", "pop": "t = M['a'].pop('k')",
                "item_del": "t = M['a']['k']; del M['a']['k']"},
               "sorted((k, x.tolist()) for k, x in M['a'].items())", "M['a'].clear()", "M['a']['k'] = w"),
    "namespace": ("S = types.SimpleNamespace()", "S.k = v",
                  {"attr": "t = S.k", "attr_del": "t = S.k; del S.k", "getattr": "t = getattr(S, 'k', None)"},
                  "[x.tolist() for x in vars(S).values()]", "vars(S).clear()", "S.k = w"),
    "object": ("S = Holder()", "S.k = v",
               {"attr": "t = S.k", "attr_del": "t = S.k; del S.k", "getattr": "t = getattr(S, 'k', None)"},
               "[x.tolist() for x in vars(S).values()]", "vars(S).clear()", "S.k = w"),
    "list": ("L = []", "L.append(v)",
             {"item": "t = L[-1]", "pop": "t = L.pop()", "item_clear": "t = L[-1]; L.clear()"},
             "[x.tolist() for x in L]", "L.clear()", "L.append(w)"),
    # Library holders (found from outside: a registered buffer rebound by forward left a fake
    # tensor in ``_buffers``; a ModuleType namespace's memo, a fake tensor in the module).
    "module_buffer": ("S = torch.nn.Module()\nS.register_buffer('k', None)", "S.k = v", {"attr": "t = S.k"},
                      "[S.k.tolist()] if S.k is not None else []", "S.k = None", "S.k = w"),
    "module_namespace": ("S = types.ModuleType('memo')", "S.k = v",
                         {"attr": "t = S.k", "getattr": "t = getattr(S, 'k', None)"},
                         "[x.tolist() for n, x in vars(S).items() if n == 'k']", "vars(S).pop('k', None)", "S.k = w"),
    "deque": ("import collections\nM = collections.deque(maxlen=4)", "M.append(v)",
              {"item": "t = M[-1]", "pop": "t = M.pop()"}, "[x.tolist() for x in M]", "M.clear()", "M.append(w)"),
    "chainmap": ("import collections\nM = collections.ChainMap({})", "M['k'] = v",
                 {"item": "t = M['k']", "get": "t = M.get('k', None)"},
                 "sorted((k, x.tolist()) for k, x in M.items())", "M.clear()", "M['k'] = w"),
    # An attribute of the user's function (Python's static-variable idiom): the heap watch
    # left functions out; the trace's write (a fake tensor) stayed, never replayed.
    "function_attr": ("def memo(): pass", "memo.k = v",
                      {"attr": "t = memo.k", "getattr": "t = getattr(memo, 'k', None)"},
                      "[memo.__dict__['k'].tolist()] if 'k' in memo.__dict__ else []",
                      "memo.__dict__.pop('k', None)", "memo.k = w"),
    "class": ("", "F.k = v",
              {"attr": "t = F.k", "attr_del": "t = F.k; del F.k", "getattr": "t = getattr(F, 'k', None)"},
              "[F.__dict__['k'].tolist()] if 'k' in F.__dict__ else []",
              "'k' in F.__dict__ and delattr(F, 'k')", "F.k = w"),
}
CASES = [(h, form) for h, spec in HOLDERS.items() for form in spec[2]]


def _define(setup: str, store: str, backward: str, module: str | None = "memo_cases") -> dict[str, Any]:
    """A fresh namespace holding ``setup``'s holder and a Function ``F`` whose forward stores
    ``v`` with ``store`` and whose backward body is ``backward``."""
    ns: dict[str, Any] = {"torch": torch, "types": types, "Holder": Holder}
    if module is not None:
        ns["__name__"] = module
    exec(f"""
{setup}
class F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        v = x.detach() * 2
        {store}
        return x * 2

    @staticmethod
    def backward(ctx, g):
        {backward}
""", ns)
    return ns


def _function(holder: str, form: str, module: str | None = "memo_cases") -> dict[str, Any]:
    """The Function (``ns["F"]``) reading ``holder`` by ``form`` in backward, and its holder."""
    setup, store, forms, *_ = HOLDERS[holder]
    return _define(setup, store, f"{forms[form]}\n        return g * 3 if t is None else g * t", module)


def _mid(ns: dict[str, Any], holder: str, change: str) -> Callable[[int], None]:
    *_, clear, replace = HOLDERS[holder]

    def mid(i: int) -> None:
        if i == 2 and change == "cleared":
            exec(clear, ns)
        if i == 2 and change == "replaced":
            ns["w"] = torch.full((3,), 7.0)
            exec(replace, ns)
    return mid


def _check(ns: dict[str, Any], holder: str, change: str) -> None:
    *_, state, clear, _ = HOLDERS[holder]
    eager_modes.matches_eager(
        ns["F"], lambda i: (torch.arange(1.0, 4.0 + i % 2).requires_grad_(),),
        state=lambda: eval(state, ns), reset=lambda: exec(clear, ns), mid=_mid(ns, holder, change))


@pytest.mark.parametrize("change", ["kept", "cleared", "replaced"])
@pytest.mark.parametrize(("holder", "form"), CASES, ids=[f"{h}-{f}" for h, f in CASES])
def test_memo_read_in_backward_matches_eager(holder: str, form: str, change: str) -> None:
    _check(_function(holder, form), holder, change)


@pytest.mark.parametrize("form", list(HOLDERS["class"][2]))
def test_memo_on_a_class_exec_made_matches_eager(form: str) -> None:
    """A class made by ``exec`` in a namespace without ``__name__`` says its module is
    "builtins": it is still the user's (a fake tensor was left in ``F.k``)."""
    ns = _function("class", form, module=None)
    assert ns["F"].__module__ == "builtins"
    _check(ns, "class", "kept")


# Deeper than minihop fetches tensors from (``routes.py``: three steps below the global): the
# caller replacing the memo with a tensor of the same properties was unseen (backward used
# forward's tensor, in every mode); now refused (MH106), and fallback runs eagerly.
DEEP = {
    "dict": ("M = {'a': {'b': {'c': {}}}}", "M['a']['b']['c']['k'] = v", "M['a']['b']['c']['k']"),
    "namespace": ("M = types.SimpleNamespace(a=types.SimpleNamespace(b=types.SimpleNamespace("
                  "c=types.SimpleNamespace())))", "M.a.b.c.k = v", "M.a.b.c.k"),
    "list": ("M = [[[[]]]]", "M[0][0][0].append(v)", "M[0][0][0][-1]"),
}


@pytest.mark.parametrize("holder", list(DEEP))
def test_memo_deeper_than_fetched_is_refused_or_matches(holder: str) -> None:
    setup, store, read = DEEP[holder]
    ns = _define(setup, store, f"return g * {read}")

    def mid(i: int) -> None:
        if i == 2:  # same shape, dtype and device as forward's: only its values differ
            exec(f"{read} = torch.full((3,), 7.0)", ns)

    eager_modes.matches_eager(ns["F"], lambda i: (torch.arange(1.0, 4.0 + i % 2).requires_grad_(),), mid=mid)


CALLS = {"n": 0}
LOG: list[str] = []
STASH: dict[str, torch.Tensor] = {}
FLAGS = {"strict": False}


class CountsThenReads(torch.autograd.Function):
    """Backward counts its calls, then reads the memo (a ``KeyError`` once the caller emptied it)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        STASH["k"] = x.detach() * 2
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        CALLS["n"] += 1
        return g * STASH["k"]


class LogsThenRaises(torch.autograd.Function):
    """Backward logs, then raises when a flag the caller sets before ``.backward()`` says so."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        LOG.append("backward")
        if FLAGS["strict"]:
            raise ValueError("strict mode: no gradient")
        return g * 2


def _reset() -> None:
    CALLS["n"] = 0
    LOG.clear()
    STASH.clear()
    FLAGS["strict"] = False


@pytest.mark.parametrize(("fn_cls", "change"), [
    (CountsThenReads, lambda i: STASH.clear() if i == 2 else None),
    (LogsThenRaises, lambda i: FLAGS.update(strict=i == 2)),
])
def test_backward_writes_before_its_own_error_stay_made(fn_cls: type, change: Any) -> None:
    """Backward traced again for the call (the caller changed what it reads) raises the user's
    error after a Python write: the write stays made, as eager's does (it was undone with the
    trace, so the counter or log fell one behind, in fallback mode too)."""
    eager_modes.matches_eager(fn_cls, lambda i: (torch.arange(1.0, 4.0).requires_grad_(),),
                              state=lambda: (CALLS["n"], list(LOG)), reset=_reset, mid=change,
                              refusable=False)


@pytest.mark.parametrize("change", ["kept", "replaced", "cleared"])
def test_a_memo_of_a_size_read_from_data_matches_eager(change: str) -> None:
    """Forward memoises ``x[x > 0]`` (its size is read from data: no stand-in can be made for
    it) in a global dict; backward reads it. Backward used forward's value whatever the caller
    had put there since; it is now refused (MH106), and fallback runs it eagerly."""
    ns = _define("M = {}", "M['k'] = v[v > 0]", "return g * M['k'].sum()")
    mid = {"kept": lambda i: None,
           "replaced": lambda i: ns["M"].__setitem__("k", torch.ones(5)) if i == 2 else None,
           "cleared": lambda i: ns["M"].clear() if i == 2 else None}[change]
    eager_modes.matches_eager(
        ns["F"], lambda i: (torch.tensor([1.0, -1.0, 2.0, 3.0])[: 2 + i % 3].requires_grad_(),),
        state=lambda: sorted((k, x.tolist()) for k, x in ns["M"].items()), reset=ns["M"].clear, mid=mid)
