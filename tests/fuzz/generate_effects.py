"""Random ``torch.autograd.Function``s that WRITE: the effects half of the adversarial fuzzer.

Each case is a module's source text, written the way users write Functions: it writes along
one to four paths chosen at random (holder x write form x phase) among attributes of a class,
items of a global dict, appends to a global list, counters (class, ``global``), pops from an
argument dict, tensors stored on a class or in a memo dict that backward reads, a dict
constant set on a class and appended to in backward, a stash forward fills and backward
reads (an item, ``pop``, read then ``del``, ``get``, ``getattr`` with a default, three dicts
deep) that ``between()`` may empty or replace, ctx attributes and lists written in
backward, ``functools.lru_cache`` helpers, ``torch.Generator`` objects made and seeded in the
Function, draws from torch's global stream, ``warnings.warn``, ``logging``, a user exception
raised after a write, and cyclic argument objects (a tree with parent links); and paths
the analysis was not written for: an ``nn.Module``'s plain attributes, a list in a dict in a
dict, a property's setter, a callable object counting its own calls, a classmethod counter,
a counter in a closure over a closure, a helper module made with ``types.ModuleType`` writing
its own global, a dict kept on ctx that backward reads and ``between()`` changes through an
alias before ``.backward()``, an attribute backward reads changed through ``vars(obj)``; and
library objects written through their own methods (``Queue.put``, ``StringIO.write``,
``array.append``, ``bytearray.extend``, ``Counter.update``, ``OrderedDict.move_to_end``,
``Event.set``, ``UserList.append``, ``SimpleQueue.put``), which ``between()`` writes too; and,
found from outside in round 6, a module's private counter beside a tensor it keeps, a write
twelve containers down, a closure variable only stored to, and an argument that is, on some
calls, the very dict the code also reads; in round 11, a buffer of the user's class over
``io.BytesIO``, an attribute of an ``int`` of the user's class, a logger's level set (a
library's setter) or its ``disabled`` flag, and ``sys.argv`` appended to; in round 14, torch's
own warnings: inside an op the graph records (``F.softmax`` without ``dim``,
``F.mse_loss(..., size_average=True)``) and from a library helper outside any op, and a write
into the tensor an ``lru_cache`` helper returned; in round 15, an object of the user's class
whose ``__del__`` writes, made and dropped by forward or backward, and an op inside the
Function's own ``warnings.catch_warnings`` block, and an object forward keeps on ctx that
backward changes, and a dict a cached helper returned, changed; in round 21, torch's process
settings read through a function not named as a getter, whether torch's modes are on, a global
tensor whose subclass has its own ``__torch_function__``, a memo keyed by ``(dtype, size)``
(written in place and cleared by ``between()``) and backward asking its grad whether it is a
view; in round 24, a tensor's own state set by assignment (``.grad``, ``.data``, ``del .grad``)
and a grad asked its ``_base``; autograd engine state set up by the phase (a version bumped,
saved-tensor hooks) and a dispatch mode it enters; in round 25, the class's ``backward``
rebound (or a ``vjp`` of its own set, or ``boxed_grads_call``) between forward and ``.backward()``.

The source defines ``make()``, the interface of ``oracle_effects.compare`` (with its
``between(i)`` hook, run after each forward and before its ``.backward()``): fresh module state
per mode (eager, strict ``minihop.function(F)``, ``minihop.function(F, fallback="eager")``),
arguments per call, and a snapshot of every piece of state the Function writes (an
lru_cache's hit counts and size are left out: tracing bypasses the cache, so a capture's
calls never fill it; its values are compared). ``run_case``
classifies an outcome: "captured" (both modes equal eager), "refused" (strict refused with a
coded error, fallback equal to eager), "silent" (a difference with no error: a bug) or
"error" (a non-minihop error eager did not raise: a bug).

``python tests/fuzz/generate_effects.py N SEED`` runs N cases and prints the tally (the
10,000-example run of ``bench/RESULTS.md``); ``tests/fuzz/test_fuzz_effects.py`` runs a
CI-sized slice.
"""

from __future__ import annotations

import collections
import hashlib
import importlib.util
import json
import pathlib
import random
import sys
import tempfile
import time
from typing import Any

import torch.distributions

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from oracle_effects import compare  # noqa: E402

__all__ = ["generate_source", "run_case", "main", "generate_effects_case", "run_effects_case"]

# kind -> (phases it may run in, needs). Each kind's lines are written by _lines below.
KINDS = {
    "class_attr": ("fb", ""), "class_counter": ("fb", ""), "global_counter": ("fb", "global"),
    "log_append": ("fb", ""), "dict_item": ("fb", ""), "arg_pop": ("f", "opts"),
    "tensor_on_class": ("f", ""), "memo_tensor": ("f", ""), "dict_constant": ("f", ""),
    "ctx_backward": ("b", ""), "lru_helper": ("fb", ""), "generator": ("fb", ""),
    "global_stream": ("fb", ""), "warn": ("fb", ""), "logging": ("fb", ""),
    "raise_after_write": ("f", ""), "cycle_arg": ("f", "node"),
    # Paths the analysis was not written for (issue 28: "what your analysis does not know"),
    # judged by the eager comparison only.
    "module_attr": ("fb", ""), "nested_container": ("fb", ""), "property_setter": ("fb", ""),
    "callable_counter": ("fb", ""), "classmethod_counter": ("fb", ""),
    "closure_closure_counter": ("fb", ""), "runtime_module_write": ("fb", ""),
    "ctx_dict_alias": ("f", ""), "attr_alias_before_backward": ("b", ""),
    # A memo forward fills and backward reads (an item, pop, pop with a default, read then
    # del, get, getattr with a default, three dicts deep), which between() keeps, empties or
    # replaces before .backward().
    "stash": ("f", ""),
    # Library objects written through their own methods (a queue, a buffer, an array, a
    # Counter, an OrderedDict's order, an Event, a SimpleQueue), which between() also changes
    # before .backward(). (A file is tested in tests/test_library_objects.py: one left open
    # per case would warn when collected, inside a later case's record.)
    "queue_put": ("fb", ""), "buffer_write": ("fb", ""), "array_append": ("fb", ""),
    "bytearray_extend": ("fb", ""), "counter_update": ("fb", ""), "ordered_move": ("fb", ""),
    "event_toggle": ("fb", ""), "userlist_append": ("fb", ""), "simplequeue_put": ("fb", ""),
    # Found from outside in round 6: a module's private counter beside a tensor it keeps, a
    # write twelve containers down, a closure variable only stored to, and an argument that
    # is, on some calls, the very dict the code also reads.
    "module_private_counter": ("f", ""), "deep_write": ("fb", ""), "store_only_cell": ("fb", ""),
    "alias_arg": ("f", "sink"),
    # Round 11: a buffer of the user's class over io.BytesIO, an attribute of an int of the
    # user's class, a logger's level set (a library's setter), sys.argv appended to.
    "native_buffer_write": ("fb", ""), "knob_counter": ("fb", ""), "logger_set_level": ("fb", ""),
    "argv_append": ("fb", ""), "logger_disabled": ("fb", ""),
    # Round 12: a handler added to a logger (a library object's list, through its method).
    "logger_add_handler": ("fb", ""),
    # Round 14: torch's own Python warning inside an op the graph records (F.softmax without
    # dim, F.mse_loss's size_average) and one a library helper gives outside any op.
    "library_warn_op": ("fb", ""), "library_warn_kwarg": ("fb", ""), "library_helper_warn": ("fb", ""),
    # ... and a write into the tensor an lru_cache helper returned (eager's cache keeps it).
    "lru_write": ("fb", ""),
    # Round 15: an object of the user's class whose __del__ bumps a counter, made and dropped
    # by the phase (a local, or a statement's value).
    "del_write": ("fb", ""),
    # ... and an op that warns (or one that does not) inside the Function's own
    # warnings.catch_warnings block, which records or hides the warning.
    "caught_warn_op": ("fb", ""), "caught_quiet_op": ("fb", ""),
    # ... and an object forward makes and keeps on ctx, changed by backward.
    "ctx_object_backward": ("b", ""),
    # ... and a dict a cached helper returned, changed (eager's cache keeps it).
    "lru_object_write": ("fb", ""),
    # Round 16: a read the user's own dunder serves, counted (a dict subclass's __getitem__,
    # a list subclass's __len__, a key's __hash__, a str subclass's __eq__, a module's
    # __getattr__): minihop's own reads must never run them; and a Python callable run on
    # each value of a tensor (Tensor.apply_), which on a fake tensor's data crashed.
    "user_dunder_read": ("fb", ""), "apply_callback": ("fb", ""),
    # Round 17: a read through an object that answers for itself (a forwarding proxy's
    # ``__class__``, a counting ``__getattribute__`` or ``__class__``), and a property whose
    # getter counts into a library container subclass (a Counter, a deque): minihop's own
    # questions must never run such code, and a trace's count must be put back.
    "self_answering_read": ("fb", ""),
    # Round 18: code that runs when an object the call makes dies (a __del__ of an object kept
    # on ctx, in a container on ctx or in a global list; a weak reference's callback on a
    # tensor the phase makes); a write into a library module's own namespace; an iterator in
    # a dict the code indexes by a computed key.
    "death_code": ("fb", ""), "library_module_write": ("fb", ""), "container_iterator": ("fb", ""),
    # Round 19: farther than the walks went: an object with a __del__ kept four containers
    # down on ctx, a write six helper calls down (into a SimpleNamespace log), an iterator three
    # lists below the dict entry the code hands to a helper.
    "deep_death_code": ("fb", ""), "deep_helper_write": ("fb", ""), "nested_iterator": ("fb", ""),
    # Round 20: what an lru_cache helper hands back, changed by the caller between calls (a
    # table written in place, a plain value of a dict entry rebound) or drawn at random once;
    # and an object eight levels down on ctx, changed by backward.
    "lru_table_changed": ("fb", ""), "lru_dict_entry": ("fb", ""), "lru_random_table": ("fb", ""),
    "deep_ctx_object_backward": ("b", ""),
    # Round 21: torch's own answers from outside the arguments: a process setting read through
    # a function not named as a getter (torch.backends.cuda.flash_sdp_enabled()), whether
    # torch's modes are on (has_torch_function: True while traced), a global tensor of a
    # subclass with its own __torch_function__ (minihop's reads must not run it), a memo keyed
    # by (dtype, size), and backward asking its grad whether it is a view.
    "torch_process_read": ("fb", ""), "trace_mode_probe": ("fb", ""), "subclass_code_read": ("fb", ""),
    "tuple_key_memo": ("f", ""), "grad_view_read": ("b", ""),
    # Round 22: a library's constant its own code reads, set by the caller between calls
    # (``Distribution.set_default_validate_args``: a Normal of an invalid scale raises where it
    # is on; ``json.JSONEncoder.item_separator``, read by the encoder's method).
    "library_class_flag": ("fb", ""),
    # Round 23: the caller's object whose death runs code (a __del__) or empties a weak
    # reference the code reads (a WeakValueDictionary entry), dropped by the phase (popped,
    # overwritten, cleared); the caller puts a fresh one, or a plain int, between calls.
    "caller_death": ("fb", ""),
    # Round 24: a tensor's own state set by assignment (``.grad``, ``.data``, ``del .grad``) on a
    # global parameter or a tensor the phase made, and a grad asked its ``_base``.
    "tensor_state_set": ("fb", ""),
    # ... autograd engine state set up by the phase (a version bumped by hand, saved-tensor hooks
    # around ops) and a dispatch mode it enters (counting aten ops).
    "engine_state": ("fb", ""), "dispatch_mode_entered": ("fb", ""),
    # Round 25: the class's backward rebound (or a vjp of its own set: eager's backward raises;
    # or boxed_grads_call set) between forward and .backward(), as a test's mock.patch.object
    # around the loss's backward.
    "method_rebound": ("fb", ""),
}

# How backward reads the stash: (its lines, its term), ``{k}`` the key, ``{t}`` a local.
STASH_READS = {
    "item": ([], "x * STASH['{k}']"),
    "pop": ([], "x * STASH.pop('{k}')"),
    "pop_default": (["{t} = STASH.pop('{k}', None)"], "(x * 3 if {t} is None else x * {t})"),
    "read_del": (["{t} = STASH['{k}']", "del STASH['{k}']"], "x * {t}"),
    "get": (["{t} = STASH.get('{k}')"], "(x * 3 if {t} is None else x * {t})"),
    "getattr": (["{t} = getattr(SNS, '{k}', None)"], "(x * 3 if {t} is None else x * {t})"),
    "deep": ([], "x * DEEP['a']['b']['c']['{k}']"),
}
STASH_CHANGES = ("keep", "clear", "replace")


def _lines(kind: str, phase: str, r: random.Random, n: int) -> tuple[list[str], str]:
    """(statements, an extra term for the result: "" or a tensor expression) for one effect.
    ``x`` is the tensor of the phase (forward's input, backward's grad); ``n`` an id."""
    v = r.choice([1, 2.5, "'a'", "(1, 2)", "None"])
    if kind == "class_attr":
        return [f"Fn.tag{n} = {v}"], ""
    if kind == "class_counter":
        return [f"Fn.calls{n} += {r.choice([1, 2])}"], ""
    if kind == "global_counter":
        return [f"COUNT{n} += 1"], ""
    if kind == "log_append":
        return [f"LOG.append(({phase!r}, {v}, int(x.shape[0])))"], ""
    if kind == "dict_item":
        return [f"STORE['k{n}'] = {v}"], ""
    if kind == "arg_pop":
        return [f"method{n} = opts.pop('method', 'sum')"], f"x * (2.0 if method{n} == 'sum' else 3.0)"
    if kind == "tensor_on_class":
        return [f"Holder.last{n} = x[0].detach() * {r.choice([1, 2])}"], ""
    if kind == "memo_tensor":
        return [f"if x.shape[0] not in MEMO:", f"    MEMO[x.shape[0]] = torch.linspace(0, 1, x.shape[0])",
                "ctx.n = x.shape[0]"], "x * MEMO[x.shape[0]]"
    if kind == "dict_constant":
        return [f"Rec.meta{n} = {{'seen': [], 'v': {v}}}"], ""
    if kind == "ctx_backward":
        return ["ctx.hits = getattr(ctx, 'hits', 0) + 1", "ctx.trail.append(len(ctx.trail))"], \
            "x * (ctx.hits + len(ctx.trail))"
    if kind == "lru_helper":
        return [], "x * table(x.shape[0])"
    if kind == "lru_write":
        return [f"_tw{n} = table(x.shape[0])", f"_tw{n}.add_(0.5)"], f"x * _tw{n}"
    if kind == "lru_object_write":
        return ["cfg_cache()['calls'] += 1"], "x * float(cfg_cache()['calls'] % 3 + 1)"
    if kind == "ctx_object_backward":
        return ["ctx.box.n += 1"], "x * float(ctx.box.n)"
    if kind == "deep_ctx_object_backward":
        return ["_innermost_ns(ctx.deepbox).n += 1"], "x * float(_innermost_ns(ctx.deepbox).n)"
    if kind == "lru_table_changed":
        return [], r.choice(["x * ctable(x.shape[0])", "x * ctable(3).sum()", "x * cpair(3)[1].mean()"])
    if kind == "lru_dict_entry":
        return [], "x * dentry(3)['w'].sum() * dentry(3)['s']"
    if kind == "torch_process_read":
        return [], r.choice(["x * (5.0 if torch.backends.cuda.flash_sdp_enabled() else 2.0)",
                             "x * (5.0 if torch.backends.cuda.math_sdp_enabled() else 2.0)"])
    if kind == "trace_mode_probe":
        return [], r.choice(["x * (5.0 if torch.overrides.has_torch_function((x,)) else 2.0)",
                             "x * (5.0 if torch._C._is_torch_function_mode_enabled() else 2.0)",
                             "x * (5.0 if sys.gettrace() is not None else 2.0)"])
    if kind == "subclass_code_read":
        return [], "x * LOGW.as_subclass(torch.Tensor).sum()"
    if kind == "tuple_key_memo":
        return ["if (x.dtype, x.shape[0]) not in TMEMO:",
                "    TMEMO[(x.dtype, x.shape[0])] = torch.arange(x.shape[0], dtype=x.dtype) + 1"], \
            "x * TMEMO[(x.dtype, x.shape[0])]"
    if kind == "library_class_flag":
        return [], r.choice(["torch.distributions.Normal(x, torch.full_like(x, DSCALE[0])).log_prob(x)",
                             "x * float(len(json.JSONEncoder().encode([1, 2, 3])))"])
    if kind == "caller_death":
        return [r.choice(["HELD.pop('o', None)", "HELD['o'] = 0", "HELD.clear()", "HELD.pop('w', None)",
                          "del HELD['w']" if phase == "forward" else "HELD.pop('w', None)"])], \
            r.choice(["x * float(DIED[0] % 3 + 1)", "x * (2.0 if WVD.get('w') is None else WVD['w'].v)"])
    if kind == "grad_view_read":
        return [], r.choice(["x * (5.0 if x._is_view() else 2.0)", "x * float(x.storage_offset() + 1)",
                             "x * (5.0 if x._base is None else 2.0)"])
    if kind == "engine_state":
        return r.choice([([f"_iv{n} = x.detach() * 1", f"torch.autograd.graph.increment_version(_iv{n})"],
                          f"x * float(_iv{n}._version)"),
                         ([f"with torch.autograd.graph.saved_tensors_hooks(lambda t: t * 2, lambda t: t):",
                           f"    _hk{n} = x * 3"], f"_hk{n}")])
    if kind == "dispatch_mode_entered":
        return [f"with CountingMode():", f"    _dm{n} = x.sin()"], f"_dm{n} * float(len(ATEN) % 3 + 1)"
    if kind == "tensor_state_set":
        return r.choice([([f"GP.grad = x.detach()[:1].sum().reshape(()) * {n + 1}"], ""),
                         (["GP.grad = None"], ""), (["del GP.grad"], ""),
                         (["GP.data = GP.data + 0.5"], "x * GP.detach()"),
                         ([f"_sd{n} = x * 2", f"_sd{n}.data = _sd{n}.data.clamp(min=0)"], f"_sd{n}"),
                         ([f"_sg{n} = torch.zeros_like(x)", f"_sg{n}.grad = x * 3"], f"_sg{n}.grad")])
    if kind == "lru_random_table":
        return [], r.choice(["x * rtable(3).sum()", "x * rtable(x.shape[0])"])
    if kind in ("caught_warn_op", "caught_quiet_op"):
        dim = "" if kind == "caught_warn_op" else ", dim=0"
        return [f"with warnings.catch_warnings(record=True) as _cw{n}:",
                f"    warnings.simplefilter({r.choice(['always', 'ignore'])!r})",
                f"    _y{n} = torch.nn.functional.softmax(x{dim})"], f"_y{n} * float(len(_cw{n}) + 1)"
    if kind == "user_dunder_read":
        return [], r.choice(["x * CD['k']", "x * float(len(CL))", "x * CK[CKey(1)]",
                             "x * (2.0 if CM == 'a' else 3.0)", "x * LAZY.SCALE", "x * DCFG.scale",
                             "x * DCFG.w.sum()"])
    if kind == "self_answering_read":
        return [], r.choice(["x * PROXYD['k']", "x * SPYO.k", "x * CLSO.k", "x * SINKP.k", "x * SINKP.q"])
    if kind == "apply_callback":
        return [f"_ap{n} = x.detach().clone()", f"_ap{n}.apply_(lambda v: v * 2)"], f"_ap{n}"
    if kind == "del_write":
        return [r.choice([f"_dying{n} = Dying()", "Dying()"])], f"x * float(DIED[0] % 3 + 1)"
    if kind == "death_code":
        lines = r.choice([[f"ctx.keep{n} = Dying()"], [f"ctx.keepl{n} = [1, {{'d': Dying()}}]"], ["KEEP.append(Dying())"],
                          [f"_t{n} = x * 1", f"_wr{n} = weakref.ref(_t{n}, lambda ref: DIED.__setitem__(0, DIED[0] + 1))"]])
        return lines, "x * float(DIED[0] % 3 + 1)"
    if kind == "deep_death_code":
        return [r.choice([f"ctx.keepd{n} = {{'a': {{'b': {{'c': [Dying()]}}}}}}",
                          f"ctx.keepo{n} = types.SimpleNamespace(a=types.SimpleNamespace(b=[{{'d': Dying()}}]))"])], \
            "x * float(DIED[0] % 3 + 1)"
    if kind == "deep_helper_write":
        return [f"_dh0(float(x.shape[0]) + {n})"], ""
    if kind == "nested_iterator":
        return [], "x * float(next(_innermost(NITERS['c'])))"
    if kind == "library_module_write":
        return [r.choice(["sys.minihop_fuzz = getattr(sys, 'minihop_fuzz', 0) + 1",
                          "torch.nn.functional.minihop_fuzz += 1",
                          "setattr(sys, 'minihop_fuzz', getattr(sys, 'minihop_fuzz', 0) + 1)",
                          # (round 22: a library class's attribute, through its module)
                          "json.JSONEncoder.minihop_fuzz += 1"])], ""
    if kind == "container_iterator":
        return [], "x * float(next(ITERS[ITER_KEY]))"
    if kind == "generator":
        return [f"g{n} = torch.Generator().manual_seed({r.randrange(100)})"], \
            f"torch.rand(x.shape, generator=g{n})"
    if kind == "global_stream":
        return [], "torch.rand(x.shape)"
    if kind == "warn":
        return [f"warnings.warn(f'{phase} {n} size {{x.shape[0]}}')"], ""
    if kind == "logging":
        return [f"LOGGER.{r.choice(['info', 'warning'])}('%s %s', {phase!r}, x.shape[0])"], ""
    if kind == "library_warn_op":
        return [], "torch.nn.functional.softmax(x)"
    if kind == "library_warn_kwarg":
        return [], "torch.nn.functional.mse_loss(x, torch.zeros_like(x), size_average=True)"
    if kind == "library_helper_warn":
        return ["_red = torch.nn.functional._Reduction.legacy_get_string(True, None)"], "float(len(_red))"
    if kind == "raise_after_write":
        return ["LOG.append('before raise')", "RAISES[0] += 1",
                "if RAISES[0] % 3 == 2:", f"    raise ValueError('call {{}} refused'.format(RAISES[0]))"], ""
    if kind == "cycle_arg":
        return [], "x * node.parent.w + node.w"
    if kind == "module_attr":
        return [f"STATS.steps += {r.choice([1, 2])}", f"STATS.last = {v}"], ""
    if kind == "nested_container":
        return [f"NEST['a']['log'].append(({phase!r}, int(x.shape[0])))"], ""
    if kind == "property_setter":
        return ["PS.value = int(x.shape[0])"], ""
    if kind == "callable_counter":
        return [], "x * SCALER()"
    if kind == "classmethod_counter":
        return ["Counter.bump()"], ""
    if kind == "closure_closure_counter":
        return [], "x * BUMP()"
    if kind == "runtime_module_write":
        return ["RT.hit()"], ""
    if kind == "ctx_dict_alias":
        # Backward reads a dict forward kept on ctx; between() changes it through an alias.
        return ["ctx.cfg = CFGD"], ""
    if kind == "attr_alias_before_backward":
        return [], "x * CONF.s"
    if kind == "queue_put":
        return [f"QU.put(({phase!r}, int(x.shape[0])))"], f"x * float(QU.qsize() % 3 + 1)"
    if kind == "buffer_write":
        return [f"BUF.write('{phase[0]}%d;' % x.shape[0])"], "x * float(len(BUF.getvalue()) % 4 + 1)"
    if kind == "array_append":
        return ["ARR.append(float(x.shape[0]))"], "x * (ARR[-1] + len(ARR))"
    if kind == "bytearray_extend":
        return ["BA.extend(b'ab')"], "x * float(len(BA) % 3 + 1)"
    if kind == "counter_update":
        return [f"CNT.update(['{phase[0]}', 'k'])"], "x * float(CNT['k'] % 3 + 1)"
    if kind == "ordered_move":
        return ["OD.move_to_end(next(iter(OD)))"], "x * OD[next(iter(OD))]"
    if kind == "event_toggle":
        return ["EVT.clear() if EVT.is_set() else EVT.set()"], "x * (2.0 if EVT.is_set() else 1.0)"
    if kind == "userlist_append":
        return ["UL.append(int(x.shape[0]))"], "x * float(len(UL) % 3 + 1)"
    if kind == "simplequeue_put":
        return ["SQ.put(1)"], "x * float(SQ.qsize() % 3 + 1)"
    if kind == "module_private_counter":
        return ["STATS._n += 1", "STATS._last = x.detach() * STATS._n"], ""
    if kind == "deep_write":
        leaf = "DEEPW['a'][0]['b']['c'][0]['d']['e'][0]['f']"
        lines = [f"{leaf}['log'].append(({phase!r}, int(x.shape[0])))"]
        return lines + ([f"{leaf}['t{n}'] = x.detach() * 2"] if phase == "forward" else []), ""
    if kind == "store_only_cell":
        return [f"COUNT_SET{n} = int(x.shape[0])"], ""
    if kind == "alias_arg":
        return ["sink['n'] += 1"], "x * float(ALIASD['n'] % 3 + 1)"
    if kind == "native_buffer_write":
        return ["NBUF.write(b'w')"], "x * float(len(NBUF.getvalue()) % 3 + 1)"
    if kind == "knob_counter":
        return ["KNOB.calls += 1"], "x * float(KNOB.calls % 3 + 1)"
    if kind == "logger_set_level":
        return ["LOGGER.setLevel(logging.INFO + (LOGGER.level % 3))"], ""
    if kind == "logger_disabled":
        return ["LOGGER.disabled = not LOGGER.disabled"], ""
    if kind == "logger_add_handler":
        return ["LOGGER.addHandler(logging.NullHandler())"], "x * float(len(LOGGER.handlers) % 3 + 1)"
    if kind == "argv_append":
        return ["sys.argv.append(ARGV_MARK)"], "x * float(sys.argv.count(ARGV_MARK) % 3 + 1)"
    if kind == "method_rebound":  # (between() rebinds; the phase reads the class as it is)
        return [], r.choice(["", "x * float(len(vars(Fn)) % 3 + 1)", "x * (2.0 if 'vjp' in vars(Fn) else 1.0)"])
    if kind == "stash":  # where forward stores it; backward's read is chosen in generate_source
        return [f"STASH['s{n}'] = x.detach() * {r.choice([2, 3])}", f"SNS.s{n} = STASH['s{n}']",
                f"DEEP['a']['b']['c']['s{n}'] = STASH['s{n}']"], ""
    raise AssertionError(kind)


def generate_source(r: random.Random) -> str:
    """One case's module source."""
    effects = [(k, r.choice(KINDS[k][0])) for k in r.sample(sorted(KINDS), r.randint(1, 4))]
    needs = {KINDS[k][1] for k, _ in effects} - {""}
    extra_args = [a for a in ("opts", "node", "sink") if a in needs]
    fwd, bwd, fwd_terms, bwd_terms, globals_ = [], [], [], [], []
    if any(k == "ctx_backward" for k, _ in effects):
        fwd.append("ctx.trail = [0]")
    if any(k == "ctx_object_backward" for k, _ in effects):
        fwd.append("ctx.box = types.SimpleNamespace(n=0)")
    if any(k == "deep_ctx_object_backward" for k, _ in effects):
        fwd.append("ctx.deepbox = _nested_ns(8)")
    if any(k == "memo_tensor" for k, _ in effects):
        bwd_terms.append("x * MEMO[ctx.n]")
    if any(k == "ctx_dict_alias" for k, _ in effects):
        bwd_terms.append("x * ctx.cfg['s']")
    stash_change = "keep"
    for n, (kind, _) in enumerate(effects):
        if kind == "stash":
            lines, term = STASH_READS[r.choice(sorted(STASH_READS))]
            bwd.extend(line.format(k=f"s{n}", t=f"t{n}") for line in lines)
            bwd_terms.append(term.format(k=f"s{n}", t=f"t{n}"))
            stash_change = r.choice(STASH_CHANGES)
    for n, (kind, phase) in enumerate(effects):
        lines, term = _lines(kind, "forward" if phase == "f" else "backward", r, n)
        if kind == "global_counter":
            globals_.append(f"COUNT{n}")
        if kind == "store_only_cell":
            globals_.append(f"COUNT_SET{n}")
        (fwd if phase == "f" else bwd).extend(lines)
        if term:
            (fwd_terms if phase == "f" else bwd_terms).append(term)
    if any(k == "dict_constant" for k, _ in effects) and r.random() < 0.5:
        bwd.extend(f"Rec.meta{n}['seen'].append(1)" for n, (k, _) in enumerate(effects) if k == "dict_constant")
    gl = [f"    global {', '.join(globals_)}"] if globals_ else []
    args = ", ".join(["x", *extra_args])
    out = [
        "import array, collections, functools, io, itertools, json, logging, queue, sys, threading, types, warnings, weakref",
        "import torch.utils._python_dispatch",
        "import torch.distributions",
        "import torch", "",
        "def make():",
        # (each mode starts from torch's and json's defaults, whatever the last call left)
        "    torch.distributions.Distribution.set_default_validate_args(True)",
        "    json.JSONEncoder.item_separator = ', '",
        "    LOG, STORE, MEMO, RAISES = [], {}, {}, [0]",
        *[f"    global_{g} = 0" for g in globals_],
        "    heard = []", "",
        "    class Heard(logging.Handler):", "        def emit(self, record):",
        "            heard.append(record.getMessage())", "",
        # One logger for every case, set afresh by each make(): a logger per case stayed in
        # logging's registry for the worker's life, and every trace's settings snapshot walks
        # that registry (a 10,000-case run slowed down case by case).
        "    LOGGER = logging.getLogger('fuzz_effects.case')",
        "    LOGGER.handlers[:] = [Heard()]", "    LOGGER.setLevel(logging.INFO)", "    LOGGER.propagate = False",
        "    LOGGER.disabled = False", "",
        "    @functools.lru_cache(maxsize=None)", "    def table(n):",
        "        return torch.arange(n, dtype=torch.float32) + 1", "",
        "    @functools.lru_cache(maxsize=None)", "    def cfg_cache():", "        return {'calls': 0}", "",
        "    @functools.lru_cache(maxsize=2)", "    def ctable(n):",
        "        return torch.arange(n, dtype=torch.float32) + 1", "",
        "    @functools.cache", "    def cpair(n):", "        return (torch.ones(n), torch.arange(n, dtype=torch.float32))", "",
        "    @functools.lru_cache(maxsize=None)", "    def dentry(n):",
        "        return {'w': torch.arange(n, dtype=torch.float32), 's': 2.0}", "",
        "    @functools.lru_cache(maxsize=None)", "    def rtable(n):", "        return torch.rand(n)", "",
        "    def _nested_ns(depth):", "        v = types.SimpleNamespace(n=0)", "        for _ in range(depth):",
        "            v = types.SimpleNamespace(c=v)", "        return v", "",
        "    def _innermost_ns(v):", "        while hasattr(v, 'c'):", "            v = v.c", "        return v", "",
        "    DIED, KEEP = [0], []", "",
        "    class WBox:", "        def __init__(self, v):", "            self.v = v", "",
        "    HELD, WVD = {'o': 5, 'w': 1}, weakref.WeakValueDictionary()", "",
        "    torch.backends.cuda.enable_flash_sdp(True); torch.backends.cuda.enable_math_sdp(True)",
        "    LOGGED, TMEMO, DSCALE = [], {}, [1.0]", "",
        "    GP = torch.nn.Parameter(torch.full((), 1.5))", "",
        "    ATEN = []", "",
        "    class CountingMode(torch.utils._python_dispatch.TorchDispatchMode):",
        "        def __torch_dispatch__(self, func, types, args=(), kwargs=None):",
        "            ATEN.append(str(func))", "            return func(*args, **(kwargs or {}))", "",
        "    class Logged(torch.Tensor):", "        @classmethod",
        "        def __torch_function__(cls, func, types, args=(), kwargs=None):",
        "            LOGGED.append(getattr(func, '__name__', '?'))",
        "            return super().__torch_function__(func, types, args, kwargs or {})", "",
        "    LOGW = torch.full((3,), 0.5).as_subclass(Logged)", "",
        "    ITERS, ITER_KEY = {'c': itertools.count(1)}, 'c'",
        "    NITERS = {'c': [[[itertools.count(1)]]]}", "",
        "    def _innermost(v):", "        while type(v) is list:", "            v = v[0]", "        return v", "",
        "    DEEPLOG = types.SimpleNamespace(a=types.SimpleNamespace(b=types.SimpleNamespace(lines=[])))", "",
        "    def _dh6(v):", "        DEEPLOG.a.b.lines.append(v)", "        return v", "",
        *(line for k in range(5, -1, -1) for line in (f"    def _dh{k}(v):", f"        return _dh{k + 1}(v)", "")),
        "    sys.minihop_fuzz = torch.nn.functional.minihop_fuzz = json.JSONEncoder.minihop_fuzz = 0", "",
        "    class Dying:", "        def __del__(self):", "            DIED[0] += 1", "",
        "    DUNDER = [0]", "",
        "    class CDict(dict):", "        def __getitem__(self, k):", "            DUNDER[0] += 1",
        "            return dict.__getitem__(self, k)", "",
        "    class CList(list):", "        def __len__(self):", "            DUNDER[0] += 1",
        "            return list.__len__(self)", "",
        "    class CKey:", "        def __init__(self, n):", "            self.n = n",
        "        def __hash__(self):", "            DUNDER[0] += 1", "            return hash(self.n)",
        "        def __eq__(self, o):", "            return isinstance(o, CKey) and o.n == self.n", "",
        "    class CMode(str):", "        def __eq__(self, o):", "            DUNDER[0] += 1",
        "            return str.__eq__(self, o)", "        __hash__ = str.__hash__", "",
        "    class DictConfig:", "        def __init__(self, **kw):", "            self.__dict__['_d'] = dict(kw)",
        "        def __getattr__(self, name):", "            DUNDER[0] += 1", "            return self._d[name]", "",
        "    CD, CL, CK, CM = CDict(k=2.0), CList([1.0, 2.0]), {CKey(1): 2.0}, CMode('a')",
        "    DCFG = DictConfig(scale=2.0, w=torch.full((3,), 1.5))",
        "    LAZY = types.ModuleType('fuzz_effects_lazy')", "    LAZY.DUNDER, LAZY.BASE = DUNDER, [2.0]",
        "    exec('def __getattr__(name):\\n    if name != \\'SCALE\\':\\n        raise AttributeError(name)\\n'",
        "         '    DUNDER[0] += 1\\n    return BASE[0]\\n', LAZY.__dict__)", "",
        "    class Proxy:", "        def __init__(self, w):", "            object.__setattr__(self, '_w', w)",
        "        @property", "        def __class__(self):", "            DUNDER[0] += 1",
        "            return type(object.__getattribute__(self, '_w'))",
        "        def __getitem__(self, k):", "            return object.__getattribute__(self, '_w')[k]", "",
        "    class Spy:", "        def __init__(self, k):", "            object.__setattr__(self, 'k', k)",
        "        def __getattribute__(self, name):", "            DUNDER[0] += 1",
        "            return object.__getattribute__(self, name)", "",
        "    class ClsSpy:", "        def __init__(self, k):", "            self.k = k",
        "        @property", "        def __class__(self):", "            DUNDER[0] += 1", "            return ClsSpy", "",
        "    SINKC, SINKQ = collections.Counter(), collections.deque()", "",
        "    class Sink:", "        @property", "        def k(self):", "            SINKC['reads'] += 1",
        "            return 2.0", "        @property", "        def q(self):", "            SINKQ.append(1)",
        "            return 3.0", "",
        "    PROXYD, SPYO, CLSO, SINKP = Proxy({'k': 2.0}), Spy(2.0), ClsSpy(2.0), Sink()", "",
        "    class Holder:", "        pass", "",
        "    class Rec:", "        pass", "",
        "    class Node:", "        def __init__(self, w, parent=None):",
        "            self.parent, self.w, self.children = parent, w, []",
        "            if parent is not None:", "                parent.children.append(self)", "",
        "    class Stats(torch.nn.Module):", "        def __init__(self):",
        "            super().__init__()", "            self.steps, self.last = 0, None", "",
        "    STATS = Stats()", "    STATS._n, STATS._last = 0, None", "    NEST = {'a': {'log': []}}",
        "    DEEPW = {'a': [{'b': {'c': [{'d': {'e': [{'f': {'log': []}}]}}]}}]}", "    ALIASD = {'n': 0}", "",
        "    class Prop:", "        def __init__(self):", "            self.history = []",
        "        @property", "        def value(self):", "            return self.history[-1]",
        "        @value.setter", "        def value(self, v):", "            self.history.append(v)", "",
        "    PS = Prop()", "",
        "    class Scaler:", "        def __init__(self):", "            self.calls = 0",
        "        def __call__(self):", "            self.calls += 1",
        "            return float(self.calls % 3 + 1)", "",
        "    SCALER = Scaler()", "",
        "    class Counter:", "        bumps = 0", "        @classmethod", "        def bump(cls):",
        "            cls.bumps += 1", "",
        "    def _counter():", "        box = [0]", "        def outer():", "            def inner():",
        "                box[0] += 1", "                return float(box[0])", "            return inner()",
        "        return outer, box", "",
        "    BUMP, BOX = _counter()",
        "    RT = types.ModuleType('fuzz_effects_rt')",
        "    exec('hits = 0\\ndef hit():\\n    global hits\\n    hits += 1\\n', RT.__dict__)",
        "    CFGD = {'s': 1.0}", "    ALIAS_CFG = CFGD", "",
        "    class Conf:", "        pass", "", "    CONF = Conf()", "    CONF.s = 1.0", "",
        "    STASH, SNS, DEEP = {}, types.SimpleNamespace(), {'a': {'b': {'c': {}}}}", "",
        "    QU, BUF, ARR, BA = queue.Queue(), io.StringIO(), array.array('d', [0.5]), bytearray()",
        "    CNT, OD = collections.Counter(), collections.OrderedDict(a=1.5, b=2.0, c=0.5)",
        "    EVT, UL, SQ = threading.Event(), collections.UserList(), queue.SimpleQueue()",
        "",
        "    class NBuf(io.BytesIO):", "        pass", "",
        "    class Knob(int):", "        pass", "",
        "    NBUF, KNOB = NBuf(), Knob(2)", "    KNOB.calls = 0",
        "    ARGV_MARK = '--fuzz-effects-%d' % id(heard)",
        "    sys.argv[:] = [a for a in sys.argv if not a.startswith('--fuzz-effects-')]",
        "",
        "    def between(i):",
        "        BUF.write('|'); ARR.append(-1.0); CNT.update(['k']); QU.put(('caller', i))",
        "        if i == 1:", "            EVT.set(); OD.move_to_end('a'); BA.extend(b'c'); UL.append(-1); SQ.put(0)",
        "        ALIAS_CFG['s'] = ALIAS_CFG['s'] + 0.5 * (i + 1)",
        "        vars(CONF)['s'] = CONF.s * 2.0",
        "        dict.__setitem__(CD, 'k', 2.0 + i); LAZY.BASE[0] = 1.0 + i; DCFG._d['scale'] = 1.0 + i",
        "        if i >= 1:", "            ctable(3).mul_(1.5); cpair(3)[1].add_(0.5); dentry(3)['s'] = 2.0 + i",
        "        if i == 1:", "            list.append(CL, 0.5); dict.__setitem__(CK, CKey(1), 3.0)",
        *(["        torch.backends.cuda.enable_flash_sdp(i != 1); torch.backends.cuda.enable_math_sdp(i != 2)"]
          if any(k == "torch_process_read" for k, _ in effects) else []),
        # (the last call leaves torch's and json's defaults: validation on, ", ")
        *(["        torch.distributions.Distribution.set_default_validate_args(i % 2 == 1)",
           "        json.JSONEncoder.item_separator = ',' if i == 2 else ', '",
           "        DSCALE[0] = -1.0 if i >= 2 else 1.0"]
          if any(k == "library_class_flag" for k, _ in effects) else []),
        *(["        HELD['o'] = Dying() if i % 2 == 0 else 5",
           "        HELD['w'] = WVD['w'] = WBox(2.0 + i)"]
          if any(k == "caller_death" for k, _ in effects) else []),
        *(["        if i == 2:", "            GP.grad = torch.full((), 4.0)"]
          if any(k == "tensor_state_set" for k, _ in effects) else []),
        *(["        if 'vjp' in vars(Fn):", "            del Fn.vjp", "        Fn.backward = _ORIG_BWD",
           "        Fn.boxed_grads_call = False", f"        if i == {r.choice([1, 2])}:",
           "            " + r.choice([f"setattr(Fn, {name!r}, staticmethod(lambda ctx, g, *rest: "
                                     f"(g * 5 + 1, *[None] * {len(extra_args)})))" for name in ("backward", "backward", "vjp")]
                                    + ["Fn.boxed_grads_call = True"])]
          if any(k == "method_rebound" for k, _ in effects) else []),
        "        for _v in TMEMO.values():", "            _v.add_(0.5)",
        "        if i == 2:", "            TMEMO.clear()",
        *{"keep": [], "clear": ["        if i == 2:", "            STASH.clear(); vars(SNS).clear(); DEEP['a']['b']['c'].clear()"],
          "replace": ["        if i == 2:", "            for k in list(STASH):",
                      "                STASH[k] = torch.full(STASH[k].shape, 7.0)",
                      "                setattr(SNS, k, STASH[k]); DEEP['a']['b']['c'][k] = STASH[k]"]}[stash_change],
        "",
        "    class Fn(torch.autograd.Function):",
        *[f"        calls{n} = 0" for n, (k, _) in enumerate(effects) if k == "class_counter"],
        "        @staticmethod", f"        def forward(ctx, {args}):",
        *["        " + g.replace("global ", "nonlocal ") for g in gl],
        *[f"            {line}" for line in fwd],
        f"            return {' + '.join(['x * 2', *fwd_terms])}", "",
        "        @staticmethod", "        def backward(ctx, x):",
        *["        " + g.replace("global ", "nonlocal ") for g in gl],
        *[f"            {line}" for line in bwd],
        f"            return {' + '.join(['x * 2', *bwd_terms])}{', None' * len(extra_args)}", "",
        "    _ORIG_BWD = vars(Fn)['backward']",
    ]
    # ``nonlocal`` needs the names bound in make(): the counters live there.
    out = [line.replace("global_COUNT", "COUNT") for line in out]
    out += [
        "    sizes = [3, 4, 3, 3]", "    passed = []", "",
        "    def args(i):",
        "        gen = torch.Generator().manual_seed(i)",
        "        x = torch.randn(sizes[i], generator=gen).requires_grad_()",
        "        extra = []",
    ]
    if "opts" in extra_args:
        out += ["        passed.append({'method': ('sum', 'mean')[i % 2], 'eps': 0.5})",
                "        extra.append(passed[-1])"]
    if "sink" in extra_args:
        out += ["        extra.append(ALIASD if i % 2 == 0 else {'n': i})"]
    if "node" in extra_args:
        out += ["        root = Node(torch.full((sizes[i],), 1.5 + i))",
                "        extra.append(Node(torch.ones(sizes[i]), root))"]
    out += [
        "        return (x, *extra)", "",
        "    def state():",
        "        def plain(v):",
        "            if isinstance(v, torch.Tensor):", "                return ('tensor', v.tolist())",
        "            if isinstance(v, dict):", "                return {k: plain(w) for k, w in v.items()}",
        "            if isinstance(v, (list, tuple)):", "                return [plain(w) for w in v]",
        "            return v",
        "        own = lambda c: {k: plain(w) for k, w in vars(c).items() if not k.startswith('__') and not callable(w)"
        " and not isinstance(w, staticmethod)}",
        f"        return plain([LOG, STORE, MEMO, RAISES, heard, passed, own(Holder), own(Rec), own(Fn), "
        f"table(3), [{', '.join(globals_)}], STATS.steps, STATS.last, NEST, PS.history, SCALER.calls, "
        f"Counter.bumps, BOX, RT.hits, CFGD, CONF.s, STASH, vars(SNS), DEEP, list(QU.queue), BUF.getvalue(), "
        f"list(ARR), bytes(BA), dict(CNT), list(OD), EVT.is_set(), list(UL), SQ.qsize(), STATS._n, STATS._last, "
        f"DEEPW, ALIASD, NBUF.getvalue(), KNOB.calls, LOGGER.level, LOGGER.disabled, sys.argv.count(ARGV_MARK), len(LOGGER.handlers), "
        f"DIED, cfg_cache(), DUNDER, dict(SINKC), list(SINKQ), len(KEEP), sys.minihop_fuzz, "
        f"torch.nn.functional.minihop_fuzz, json.JSONEncoder.minihop_fuzz, list(DEEPLOG.a.b.lines), list(LOGGED), "
        f"{{str(k): v for k, v in TMEMO.items()}}, sorted(HELD), sorted(WVD.keys()), GP.detach(), GP.grad, len(ATEN)])",
        "", "    return Fn, args, state, between",
    ]
    return "\n".join(out) + "\n"


def _load(source: str, directory: pathlib.Path, index: int) -> Any:
    path = directory / f"fuzz_effects_{index}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def run_case(source: str, directory: pathlib.Path, index: int) -> tuple[str, str]:
    """(outcome, detail): "captured", "refused" (detail: the error's first line), "silent" or
    "error" (detail: the difference)."""
    module = _load(source, directory, index)
    try:
        verdicts = compare(module.make, calls=4)
    except Exception as e:  # an error outside the user's code, in the oracle's own run
        return "error", f"{type(e).__name__}: {e}"
    finally:  # (the defaults library_class_flag's calls change: never left to the next case)
        torch.distributions.Distribution.set_default_validate_args(True)
        json.JSONEncoder.item_separator = ", "
    if verdicts["fallback"] != "same":
        return "silent", f"fallback {verdicts['fallback']}"
    if verdicts["strict"] == "same":
        return "captured", ""
    if verdicts["strict"].startswith("refused"):
        return "refused", verdicts["strict"].removeprefix("refused ")
    return "silent", f"strict {verdicts['strict']}"


def generate_effects_case(ch: Any) -> Any:
    """``bench/fuzz.py``'s interface: a ``generate.Case`` from a ``RandomChooser``."""
    from generate import Case
    return Case(generate_source(ch.rng), ("effects",))


_KINDS = {"captured": "matched", "refused": "refused", "silent": "mismatched", "error": "crashed"}


def run_effects_case(case: Any, directory: pathlib.Path) -> Any:
    """``bench/fuzz.py``'s interface: an ``oracle.Outcome`` for a ``generate.Case``."""
    from oracle import Outcome
    index = int(hashlib.sha1(case.source.encode()).hexdigest()[:12], 16)
    outcome, detail = run_case(case.source, directory, index)
    kind = _KINDS[outcome]
    return Outcome(kind, code=_code(detail) if kind == "refused" else "", signature=detail[:120], detail=detail)


def _code(detail: str) -> str:
    """``SideEffectError: [MH106] ...`` -> ``MH106``."""
    return detail.partition("[")[2].partition("]")[0] or detail.split(":")[0]


def main(count: int, seed: int) -> collections.Counter[str]:
    directory = pathlib.Path(tempfile.mkdtemp(prefix="minihop_fuzz_effects_"))
    tally: collections.Counter[str] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    start = time.perf_counter()
    for i in range(count):
        source = generate_source(random.Random(seed * 1_000_003 + i))
        outcome, detail = run_case(source, directory, i)
        tally[outcome] += 1
        if outcome == "refused":
            reasons[_code(detail)] += 1
        if outcome in ("silent", "error"):
            print(f"--- case {i} (seed {seed}): {outcome}: {detail[:500]}\n{source}", flush=True)
    print(f"{count} cases, seed {seed}, {time.perf_counter() - start:.0f} s: {dict(tally)}")
    print("refusals:", dict(reasons.most_common()))
    return tally


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100, int(sys.argv[2]) if len(sys.argv) > 2 else 0)
