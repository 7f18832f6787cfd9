"""Library objects crossed with where they are held and how they are written: a queue, a
buffer, an array and a ``Counter`` × held in a global, a closure cell, a user object's
attribute, a list argument, on ctx, in a global dict × written directly, by a helper, by a
lambda, by an inner Function's forward × in forward or in backward (176 cases).

Before, a ``Counter.update`` written directly differed from eager in 16 of them: the value the
library code set was replayed as a constant, though it depended on what was there, which
nothing guarded (``tracer/state_writes.py``). Each case runs eagerly and in strict, apply and
fallback mode (``eager_modes.matches_eager``).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

import eager_modes

# object: (its setup, a write ({m}: the object as the code reaches it), its state, how to empty it)
OBJS = {
 "queue": ("import queue\nM = queue.Queue()", "{m}.put(1)", "list(M.queue)", "M.queue.clear()"),
 "stringio": ("import io\nM = io.StringIO()", "{m}.write('ab')", "M.getvalue()", "M.seek(0); M.truncate()"),
 "array": ("import array\nM = array.array('d')", "{m}.append(1.5)", "list(M)", "del M[:]"),
 "counter": ("import collections\nM = collections.Counter()", "{m}.update(['k'])", "dict(M)", "M.clear()"),
}
# holder: (its setup, how the code reaches the object, the forward parameter, the extra arguments)
HOLDERS = {
 "global": ("", "M", "", "()"),
 "closure": ("", "m_cell", "", "()"),
 "obj_attr": ("class Box: pass\nBOX = Box()\nBOX.m = M", "BOX.m", "", "()"),
 "list_arg": ("", "ms[0]", "ms", "([M],)"),
 "ctx": ("", "ctx.m", "", "()"),
 "dict_global": ("D = {'m': M}", "D['m']", "", "()"),
}
# how the write is made ({w}: the write itself)
VIA = {"direct": "{w}", "helper": "helper({m})", "lambda": "(lambda: {w})()", "inner": "Inner.apply(x, {m})"}


def make(obj: str, holder: str, via: str, phase: str) -> Any:
    """(the Function, its arguments per call, the object's state, how to reset it)."""
    setup, write, state, reset = OBJS[obj]
    hsetup, mexpr, param, extra = HOLDERS[holder]
    w = write.format(m=mexpr)
    helper_w = write.format(m="mm")
    stmt = VIA[via].format(w=w, m=mexpr)
    params = ", " + param if param else ""
    nones = ", None" if param else ""
    fwd_stmt = stmt if phase == "f" else "pass"
    bwd_stmt = stmt.replace("Inner.apply(x,", "Inner.apply(g,") if phase == "b" else "pass"
    ctx_line = "ctx.m = M" if holder == "ctx" else "pass"
    src = f"""
{setup}
{hsetup}
def helper(mm):
    {helper_w}
class Inner(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, mm):
        {helper_w}
        return t * 1
    @staticmethod
    def backward(ctx, g):
        return g, None
def make():
    m_cell = M
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x{params}):
            {ctx_line}
            {fwd_stmt.replace('ctx.m', 'M') if holder == 'ctx' and phase == 'f' else fwd_stmt}
            return x * 2
        @staticmethod
        def backward(ctx, g):
            {bwd_stmt}
            return g * 2{nones}
    return F
"""
    ns: dict[str, Any] = {"__name__": "library_crossed", "torch": torch}
    exec(src, ns)
    F = ns["make"]()
    margs = eval(f"lambda i: (torch.arange(1.0, 4.0).requires_grad_(), *{extra})", ns)
    return F, margs, (lambda: eval(state, ns)), (lambda: exec(reset, ns))


CASES = [c for c in itertools.product(OBJS, HOLDERS, VIA, "fb") if not (c[1] == "ctx" and c[3] == "f")]


@pytest.mark.parametrize(("obj", "holder", "via", "phase"), CASES, ids=["-".join(c) for c in CASES])
def test_library_object_crossed_matches_eager(obj: str, holder: str, via: str, phase: str) -> None:
    fn, make_args, state, reset = make(obj, holder, via, phase)
    eager_modes.matches_eager(fn, make_args, state=state, reset=reset)
