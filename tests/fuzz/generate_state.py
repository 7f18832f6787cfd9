"""Random ``torch.autograd.Function``s that read and write Python state, as source text.

The Python-state half of the fuzzer (``generate.py`` makes the tensor-program half; this
module shares its ``Chooser`` and ``Case`` and leaves it unchanged). ``oracle_state.py`` runs the
cases; ``tests/fuzz/test_fuzz_python_state.py`` and ``python -m bench fuzz --generator
python-state`` drive them.

A case's source is a complete module with a fixed interface for the oracle:

  Fuzz          the Function (made by ``make_function()`` when it closes over cells).
  make_args()   its arguments: 1-2 tensors and, when the Function reads or writes an argument
                object, the module's ``CFG`` (a ``Config``; the same object every call, as a
                user's config is).
  set_value(v)  sets every *read source* the Function uses to ``v`` (a float; a bool source
                gets ``v > 1``).
  read_state()  a snapshot of every *write target*: counters, the ``LOG`` list, an attribute
                of an outside object; compared with eager's after each forward and backward.
  STEPS         ``[(forward_value, backward_value), ...]``: the oracle sets the first before
                a call, runs forward, sets the second, runs ``.backward()``.

Read sources: a class attribute of the Function (``Fuzz.scale``), an attribute of the argument
object (``cfg.scale``; backward reads ``ctx.cfg.scale`` live or a value forward put on ctx),
a module global (``SCALE``), a closure cell (``scale``, rebound by ``set_closure``), a global
bool (``FLAG``) that forward branches on. Each is read in forward and maybe in backward.
Write targets: a counter on the class, on the argument object, a global (``global CALLS``), a
closure cell (``nonlocal calls``); ``LOG.append(...)`` of Python values; an attribute set on an
outside object (``RECORDER.last``); ``if DEBUG: print(...)`` with ``DEBUG = False``; rarely a
real ``print``. Each happens in forward or backward. Sometimes forward also lets a tensor out
another way than its return value: appended to a caller's list (``STASH``), set on the argument
object (``cfg.t``), set as an attribute of its output (``out._soft``, listed in
``OUTPUT_ATTRIBUTES``), or an unreturned input buffer (``BUF``) updated in place without
``mark_dirty``; ``read_state()`` gives such tensors as rounded values and ``requires_grad``.

Invariant: a case's source depends only on the choices made (a seed reproduces it).
"""

from __future__ import annotations

import dataclasses

from generate import Case, Chooser

__all__ = ["READS", "WRITES", "generate_state_case"]

READS = ("class", "cfg", "global", "closure", "flag")
WRITES = ("class_counter", "cfg_counter", "global_counter", "closure_counter", "log", "attribute",
          "debug_print", "print")
# Tensors leaving forward by other ways than its return value (forward only, rarer).
TENSOR_WRITES = ("into_list", "onto_object", "output_attribute", "buffer_inplace")
_VALUES = (2.0, 3.0, 0.5, -1.5)


@dataclasses.dataclass
class _Method:
    """One method's body being built: declarations first, then statements."""

    declarations: list[str] = dataclasses.field(default_factory=list)
    lines: list[str] = dataclasses.field(default_factory=list)

    def declare(self, line: str) -> None:
        if line not in self.declarations:
            self.declarations.append(line)

    def render(self) -> list[str]:
        return self.declarations + self.lines


class _StateBuilder:
    def __init__(self, ch: Chooser) -> None:
        self.ch = ch
        self.features: list[str] = []

    def read_expr(self, source: str, where: str) -> str:
        """The expression that reads ``source`` in forward or backward."""
        if source == "class":
            return "Fuzz.scale"
        if source == "cfg":
            return "cfg.scale" if where == "forward" else "ctx.cfg.scale"
        if source == "global":
            return "SCALE"
        if source == "closure":
            return "scale"
        raise AssertionError(source)

    def build(self) -> Case:
        ch = self.ch
        n_reads = ch.integer(0, 2)
        reads = list(dict.fromkeys(ch.choice(READS) for _ in range(n_reads)))
        n_writes = ch.integer(0 if reads else 1, 2)
        writes = list(dict.fromkeys(ch.choice(WRITES[:-1]) if not ch.chance(10) else "print"
                                    for _ in range(n_writes)))
        tensor_write = ch.choice(TENSOR_WRITES) if ch.chance(25) else None
        if tensor_write:
            writes.append(tensor_write)
        self.features += [f"read-{r}" for r in reads] + [f"write-{w}" for w in writes]
        uses_cfg = "cfg" in reads or "cfg_counter" in writes or "onto_object" in writes
        closure = "closure" in reads or "closure_counter" in writes
        shape = ch.choice(["(2, 3)", "(3,)", "(4,)"])
        two = ch.chance(30)
        tensor_args = ["x0", "x1"] if two else ["x0"]
        argnames = tensor_args + (["cfg"] if uses_cfg else []) + (["stash"] if "into_list" in writes else []) \
            + (["buf"] if "buffer_inplace" in writes else [])

        fwd, bwd = _Method(), _Method()
        numeric = [r for r in reads if r != "flag"]
        # forward: the tensor program around the reads
        first = self.read_expr(numeric[0], "forward") if numeric else "2.0"
        fwd.lines.append(f"v0 = x0 * {first}")
        fwd.lines.append(f"v1 = {ch.choice(['v0.sin()', 'v0.tanh()', 'v0 * v0', 'v0.exp() * 0.1'])}")
        if two:
            fwd.lines.append("v1 = v1 + x1 * 0.5")
        last = "v1"
        if len(numeric) > 1:
            fwd.lines.append(f"v2 = v1 + {self.read_expr(numeric[1], 'forward')}")
            last = "v2"
        if "flag" in reads:
            fwd.lines += ["if FLAG:", f"    v3 = {last} * 2", "else:", f"    v3 = {last} - 1"]
            last = "v3"
        fwd.lines.append("ctx.save_for_backward(x0)")
        if uses_cfg:
            fwd.lines.append("ctx.cfg = cfg")
        # backward: maybe the same reads again, live or through a value forward put on ctx
        bwd.lines.append("x0, = ctx.saved_tensors")
        factor = "x0.cos()"
        for r in numeric:
            how = ch.choice(["live", "live", "ctx", "none"])
            self.features.append(f"bwd-read-{r}-{how}")
            if how == "live":
                factor += f" * {self.read_expr(r, 'backward')}"
            elif how == "ctx":
                fwd.lines.append(f"ctx.{r}_value = {self.read_expr(r, 'forward')}")
                factor += f" * ctx.{r}_value"
        if "flag" in reads and ch.chance(50):
            bwd.lines += ["if FLAG:", "    g0 = g0 * 3"]
            self.features.append("bwd-read-flag-live")
        # the tensor write, in forward
        if tensor_write == "into_list":
            fwd.lines.append("stash.append(v0 * 10)")
        elif tensor_write == "onto_object":
            fwd.lines.append("cfg.t = v0 * 10")
        elif tensor_write == "output_attribute":
            fwd.lines.append(f"{last}._soft = v0")
        elif tensor_write == "buffer_inplace":
            fwd.lines.append("buf.mul_(0.5).add_(x0.detach().mean())")
        # the Python writes, each in forward or backward
        for w in writes:
            if w in TENSOR_WRITES:
                continue
            where = "backward" if ch.chance(30) else "forward"
            self.features.append(f"{w}-in-{where}")
            m = fwd if where == "forward" else bwd
            value = self.read_expr(numeric[0], where) if numeric and ch.chance(50) else (
                "x0.shape[0]" if where == "forward" else "g0.dim()")
            cfg = "cfg" if where == "forward" else "ctx.cfg"
            if w == "class_counter":
                m.lines.append("Fuzz.calls += 1")
            elif w == "cfg_counter":
                m.lines.append(f"{cfg}.calls += 1")
            elif w == "global_counter":
                m.declare("global CALLS")
                m.lines.append("CALLS += 1")
            elif w == "closure_counter":
                m.declare("nonlocal calls")
                m.lines.append("calls += 1")
            elif w == "log":
                m.lines.append(f'LOG.append(("{where}", {value}))')
            elif w == "attribute":
                m.lines.append(f"RECORDER.last = {value}")
            elif w == "debug_print":
                m.lines += ["if DEBUG:", f'    print("{where}", {value})']
            elif w == "print":
                m.lines.append(f'print("{where}", {value})')
        fwd.lines.append(f"return {last}")
        grads = ["g0 * " + factor] + (["g0 * 0.5"] if two else [])
        if two and ch.chance(30):
            grads[1] = "None"
        grads += ["None"] * (len(argnames) - len(grads))
        bwd.lines.append(f"return {', '.join(grads)}")

        steps = self.steps(reads)
        return Case(self.render(argnames, fwd, bwd, closure, reads, writes, uses_cfg, shape, two,
                                steps), tuple(dict.fromkeys(self.features)))

    def steps(self, reads: list[str]) -> list[tuple[float, float]]:
        """Three calls; the value changes between calls and, sometimes, before backward."""
        ch = self.ch
        steps = []
        for _ in range(3):
            fwd = ch.choice(_VALUES)
            bwd = ch.choice(_VALUES) if ch.chance(40) else fwd
            steps.append((fwd, bwd))
        if reads and all(f == steps[0][0] for f, _ in steps):
            steps[1] = (_VALUES[(_VALUES.index(steps[1][0]) + 1) % len(_VALUES)], steps[1][1])
        if reads and any(f != b for f, b in steps):
            self.features.append("changed-before-backward")
        return steps

    def render(self, argnames: list[str], fwd: _Method, bwd: _Method, closure: bool, reads: list[str],
               writes: list[str], uses_cfg: bool, shape: str, two: bool,
               steps: list[tuple[float, float]]) -> str:
        out = ["import torch", "", "",
               "class Config:", "    def __init__(self):", "        self.scale = 2.0",
               "        self.calls = 0", "", "",
               "class Recorder:", "    last = None", "", "",
               "CFG = Config()", "RECORDER = Recorder()", "SCALE = 2.0", "FLAG = True", "CALLS = 0",
               "LOG = []", "DEBUG = False", "STASH = []", f"BUF = torch.zeros({shape})",
               "OUTPUT_ATTRIBUTES = " + repr(["_soft"] if "output_attribute" in writes else []), "", "",
               "def plain(t):", "    # a comparable form of a tensor: rounded values and requires_grad",
               "    if t is None:", "        return None",
               "    return [round(v, 4) for v in t.detach().reshape(-1).tolist()], t.requires_grad", "", ""]
        cls = ["class Fuzz(torch.autograd.Function):", "    scale = 2.0", "    calls = 0", "",
               "    @staticmethod", f"    def forward(ctx, {', '.join(argnames)}):"]
        cls += ["        " + line for line in fwd.render()]
        cls += ["", "    @staticmethod", "    def backward(ctx, g0):"]
        cls += ["        " + line for line in bwd.render()]
        if closure:
            out += ["def make_function():", "    scale = 2.0", "    calls = 0", ""]
            out += ["    " + line if line else "" for line in cls]
            out += ["", "    def set_closure(value):", "        nonlocal scale", "        scale = value",
                    "", "    def closure_calls():", "        return calls", "",
                    "    return Fuzz, set_closure, closure_calls", "", "",
                    "Fuzz, set_closure, closure_calls = make_function()", "", ""]
        else:
            out += cls + ["", ""]
        setters = []
        if "global" in reads or "flag" in reads:
            setters.append("global " + ", ".join(n for r, n in (("global", "SCALE"), ("flag", "FLAG"))
                                                 if r in reads))
        for r in reads:
            setters.append({"class": "Fuzz.scale = value", "cfg": "CFG.scale = value",
                            "global": "SCALE = value", "closure": "set_closure(value)",
                            "flag": "FLAG = value > 1"}[r])
        out += ["def set_value(value):"] + ["    " + s for s in setters or ["pass"]] + ["", ""]
        state = []
        for w in writes:
            state += {"class_counter": ['"Fuzz.calls": Fuzz.calls'], "cfg_counter": ['"CFG.calls": CFG.calls'],
                      "global_counter": ['"CALLS": CALLS'], "closure_counter": ['"calls": closure_calls()'],
                      "log": ['"LOG": list(LOG)'], "attribute": ['"RECORDER.last": RECORDER.last'],
                      "debug_print": [], "print": [], "into_list": ['"STASH": [plain(t) for t in STASH]'],
                      "onto_object": ['"CFG.t": plain(getattr(CFG, "t", None))'], "output_attribute": [],
                      "buffer_inplace": ['"BUF": plain(BUF)']}[w]
        out += ["def read_state():", "    return {" + ", ".join(state) + "}", "", ""]
        out += [f"STEPS = {steps!r}", "", ""]
        make = ["def make_args():", "    gen = torch.Generator().manual_seed(0)",
                f"    x0 = torch.randn({shape}, generator=gen).requires_grad_(True)"]
        if two:
            make.append(f"    x1 = torch.randn({shape}, generator=gen).requires_grad_(True)")
        passed = {"cfg": "CFG", "stash": "STASH", "buf": "BUF"}
        make.append(f"    return ({''.join(passed.get(n, n) + ', ' for n in argnames).rstrip(' ')})")
        out += make + [""]
        return "\n".join(out)


def generate_state_case(ch: Chooser) -> Case:
    """A random Function reading and writing Python state (see the module docstring)."""
    return _StateBuilder(ch).build()


if __name__ == "__main__":
    import sys

    from generate import print_cases

    print_cases(generate_state_case, sys.argv)
