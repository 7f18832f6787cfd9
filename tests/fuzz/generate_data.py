"""Random ``torch.autograd.Function``s that take Python values out of tensor data, as source text.

The data-dependent third of the fuzzer (``generate.py``: tensor programs; ``generate_state.py``:
Python state). It shares ``generate.py``'s ``Chooser`` and ``Case``, and its cases speak the
protocol of ``oracle_state.py``, which runs them (``run_data_case``: exact comparison);
``tests/fuzz/test_fuzz_data_dependent.py`` and ``python -m bench fuzz --generator
data-dependent`` drive them.

What a Function does with tensor data (each chosen or not, forward and backward apart):
  forward     ``.item()`` as a divisor (kept on ctx for backward) or a scale; ``int(n)`` of a
              0-d argument as a loop count; ``.tolist()`` as split sizes and as a count of
              positive entries; ``int((x > 0).sum())``; a Python branch on ``v.sum() > 0``,
              ``(x > 0).all()``, ``(x > 1).any()``, ``torch.equal(x0, x1)``, a 0-d argument
              compared with an int (``if d == 0``); ``torch.tensor(k)`` made from a Python int
              and read back (``.item()``); a boolean-mask write (``v[x0 < 0] = 0``,
              ``v[m] = -v[m]``); and, last, an output whose size is data-dependent
              (``v[x0 > 0]``, ``masked_select``, ``nonzero`` + index); a write at an index
              read out of a tensor (``v.view(-1)[x0.abs().argmax()] = 0``); an op that raises
              for some values inside ``try``/``except RuntimeError`` (``_assert_async``).
  backward    scatters the grad back to the input's shape when forward's output size was
              data-dependent, then: the surrogate-gradient flip ``g[x >= 0] = -g[x >= 0]``,
              ``x.abs().max().item()`` as a divisor, a branch on a saved input's sum, a branch
              on the grad itself (``(g > 0).all()``), a loop count or ``.item()`` of a saved
              0-d tensor, split sizes from a saved tensor's ``.tolist()``,
              ``masked_scatter``/``masked_select`` and ``nonzero`` + ``index_add`` round trips,
              a write at an index read out of a saved tensor, the same ``try`` as forward's.

The data changes from call to call (3-5 calls): each call's inputs are literals in the source
(``X0[call]``...), chosen so that signs flip (branches alternate), the count of True mask
entries changes, a call sometimes repeats an earlier call's data (a cache hit must serve it),
``x1`` sometimes equals ``x0`` and loop counts, split sizes and 0-d arguments change; the
loss's weight per call (``loss_weight()``) changes sign, so a branch on the grad alternates.

The module's interface (``oracle_state.py``): ``Fuzz``, ``make_args()`` (the arguments of the
current call), ``set_value(call)`` (selects the call), ``read_state()`` (empty: no Python
state), ``STEPS`` (``[(call, call), ...]``) and ``loss_weight()``.

Invariant: a case's source depends only on the choices made (a seed reproduces it).
"""

from __future__ import annotations

import dataclasses

from generate import Case, Chooser

__all__ = ["BACKWARD_FEATURES", "FORWARD_FEATURES", "OUTPUT_FEATURES", "generate_data_case"]

OUTPUT_FEATURES = ("mask_index", "masked_select", "nonzero_index")
_VALUES = (-2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0)
_WEIGHTS = (1.5, -0.5, 2.0, -1.0, 0.25)


# Each feature's lines: forward's work on ``v`` (``x0``'s shape), backward's on ``gx``.
_FORWARD_LINES: dict[str, list[str]] = {
    "item_divisor": ["scale = x0.abs().max().item() + 1", "ctx.scale = scale", "v = v / scale"],
    "item_scale": ["v = v * v.sum().item()"],
    "loop_count": ["for _ in range(int(n)):", "    v = v * 1.5"],
    "tolist_split": ["parts = v.reshape(-1).split(sizes.tolist())",
                     "v = torch.cat([p * (i + 1) for i, p in enumerate(parts)]).reshape(v.shape)"],
    "tolist_count": ["positive = sum(1 for a in x0.reshape(-1).tolist() if a > 0)", "v = v + positive"],
    "mask_count": ["v = v * int((x0 > 0).sum())"],
    "branch_sum": ["if v.sum() > 0:", "    v = v * 2", "else:", "    v = v - 1"],
    "branch_all": ["if (x0 > 0).all():", "    v = v.sin()", "else:", "    v = v * 3"],
    "branch_any": ["if (x0 > 1).any():", "    v = v + 2"],
    "torch_equal": ["if torch.equal(x0, x1):", "    v = v * 2", "else:", "    v = v + x1"],
    "dim_compare": ["if d == 0:", "    v = v * 3", "v = v + int(d)"],
    "constant_item": ["v = v * torch.tensor(k).item()"],
    "mask_write": ["v = v.clone()", "v[x0 < 0] = 0"],
    "mask_negate": ["v = v.clone()", "m = x0 >= 0", "v[m] = -v[m]"],
    # a write at an index read out of a tensor (a 0-d index: its value is read when it runs)
    "index_write": ["v = v.clone(memory_format=torch.contiguous_format)", "v.view(-1)[x0.reshape(-1).abs().argmax()] = 0.0"],
    # an op that raises for some values, inside the user's try (round 13)
    "try_raises": ["try:", "    torch._assert_async((x0 > -1.5).all())", "    v = v * 2",
                   "except RuntimeError:", "    v = v - 1"],
}
_BACKWARD_LINES: dict[str, list[str]] = {
    "surrogate_flip": ["gx = gx.clone()", "gx[x0 >= 0] = -gx[x0 >= 0]"],
    "item_divisor": ["gx = gx * 2 / (x0.abs().max().item() + 1)"],
    "branch_saved": ["if x0.sum() > 0:", "    gx = gx * 2", "else:", "    gx = gx * -1"],
    "branch_grad": ["if (gx > 0).all():", "    gx = gx * 2", "else:", "    gx = gx * 3"],
    "loop_count": ["for _ in range(int(n)):", "    gx = gx * 2"],
    "constant_item": ["gx = gx * c.item()"],
    "tolist_split": ["parts = gx.reshape(-1).split(sizes.tolist())",
                     "gx = torch.cat([p * (i + 2) for i, p in enumerate(parts)]).reshape(gx.shape)"],
    "masked_round_trip": ["gx = torch.zeros_like(gx).masked_scatter(x0 > 0, gx.masked_select(x0 > 0)) + gx * 0.5"],
    "nonzero_round_trip": ["nz = torch.nonzero(x0.reshape(-1) < 0).squeeze(1)",
                           "gx = gx.reshape(-1).index_add(0, nz, gx.reshape(-1)[nz]).reshape(gx.shape)"],
    "index_write": ["gx = gx.clone(memory_format=torch.contiguous_format)", "gx.view(-1)[x0.reshape(-1).argmin()] = 0.0"],
    "try_raises": ["try:", "    torch._assert_async((x0 > -1.5).all())", "    gx = gx * 2",
                   "except RuntimeError:", "    gx = gx * 3"],
}
FORWARD_FEATURES = tuple(_FORWARD_LINES)
BACKWARD_FEATURES = tuple(_BACKWARD_LINES)


@dataclasses.dataclass
class _Data:
    """Each call's inputs, as lists the source holds as literals."""

    x0: list[list[float]] = dataclasses.field(default_factory=list)
    x1: list[list[float]] = dataclasses.field(default_factory=list)
    n: list[int] = dataclasses.field(default_factory=list)
    sizes: list[list[int]] = dataclasses.field(default_factory=list)
    d: list[int] = dataclasses.field(default_factory=list)
    k: list[int] = dataclasses.field(default_factory=list)
    weight: list[float] = dataclasses.field(default_factory=list)


class _DataBuilder:
    def __init__(self, ch: Chooser) -> None:
        self.ch = ch
        self.features: list[str] = []

    # -- the data of each call ---------------------------------------------------------------

    def _values(self, numel: int, previous: list[list[float]]) -> list[float]:
        ch = self.ch
        pattern = ch.choice(["mixed", "positive", "negative", "repeat", "negated"]) if previous else "mixed"
        if pattern == "repeat":
            self.features.append("data-repeats-a-call")
            return list(ch.choice(previous))
        if pattern == "negated":
            return [-v for v in previous[-1]]
        values = [ch.choice(_VALUES) for _ in range(numel)]
        if pattern == "positive":
            return [abs(v) + 0.5 for v in values]
        if pattern == "negative":
            return [-abs(v) - 0.5 for v in values]
        return values

    def _sizes(self, numel: int) -> list[int]:
        parts = self.ch.integer(1, min(3, numel))
        cuts = sorted({self.ch.integer(1, numel - 1) for _ in range(parts - 1)}) if numel > 1 else []
        bounds = [0, *cuts, numel]
        return [b - a for a, b in zip(bounds, bounds[1:], strict=False)]

    def data(self, calls: int, numel: int, dims: int) -> _Data:
        ch = self.ch
        data = _Data()
        for _ in range(calls):
            data.x0.append(self._values(numel, data.x0))
            data.x1.append(list(data.x0[-1]) if ch.chance(40) else self._values(numel, data.x1))
            data.n.append(ch.integer(0, 3))
            data.sizes.append(self._sizes(numel))
            data.d.append(ch.choice([-1, 0] if dims == 1 else [-1, 0, 1]))
            data.k.append(ch.choice([2, 3]))
            data.weight.append(ch.choice(_WEIGHTS))
        return data

    # -- forward and backward ----------------------------------------------------------------

    def build(self) -> Case:
        ch = self.ch
        shape = ch.choice([(4,), (5,), (2, 3)])
        numel = 1
        for s in shape:
            numel *= s
        dims = len(shape)
        n_fwd = ch.integer(0, 3)
        forward = list(dict.fromkeys(ch.choice(FORWARD_FEATURES) for _ in range(n_fwd)))
        output = ch.choice(OUTPUT_FEATURES) if ch.chance(30) else None
        n_bwd = ch.integer(0 if forward or output else 1, 2)
        backward = list(dict.fromkeys(ch.choice(BACKWARD_FEATURES) for _ in range(n_bwd)))
        two = "torch_equal" in forward or ch.chance(25)
        x1_grad = two and ch.chance(70)
        self.features += [f"fwd-{f}" for f in forward] + [f"bwd-{f}" for f in backward]
        if output:
            self.features.append(f"out-{output}")

        args = ["x0"] + (["x1"] if two else [])
        if "loop_count" in forward or "loop_count" in backward:
            args.append("n")
        if "tolist_split" in forward or "tolist_split" in backward:
            args.append("sizes")
        if "dim_compare" in forward:
            args.append("d")
        if "constant_item" in forward or "constant_item" in backward:
            args.append("k")

        fwd = [f"v = {ch.choice(['x0 * 2', 'x0 + 1', 'x0.tanh()', 'x0 * x0'])}"]
        if two:
            fwd.append("v = v + x1 * 0.5")
        saved = ["x0"]
        for f in forward:
            fwd += _FORWARD_LINES[f]
        if "constant_item" in backward:
            fwd.append("c = torch.tensor(k)")
            saved.append("c")
        if "loop_count" in backward:
            saved.append("n")
        if "tolist_split" in backward:
            saved.append("sizes")
        if output == "mask_index":
            fwd.append("v = v[x0 > 0]")
        elif output == "masked_select":
            fwd.append("v = torch.masked_select(v, x0 > 0)")
        elif output == "nonzero_index":
            fwd += ["idx = torch.nonzero(x0.reshape(-1) > 0).squeeze(1)", "v = v.reshape(-1)[idx]"]
            saved.append("idx")
        fwd += [f"ctx.save_for_backward({', '.join(saved)})", "return v"]

        bwd = [f"{', '.join(saved)}, = ctx.saved_tensors"]
        if output == "mask_index":
            bwd += ["gx = torch.zeros_like(x0)", "gx[x0 > 0] = g"]
        elif output == "masked_select":
            bwd.append("gx = torch.zeros_like(x0).masked_scatter(x0 > 0, g)")
        elif output == "nonzero_index":
            bwd.append("gx = torch.zeros(x0.numel(), dtype=g.dtype).index_add(0, idx, g).reshape(x0.shape)")
        else:
            bwd.append("gx = g * 1")
        if "item_divisor" in forward and ch.chance(60):
            bwd.append("gx = gx / ctx.scale")
            self.features.append("bwd-reads-ctx-scale")
        for f in backward:
            bwd += _BACKWARD_LINES[f]
        grads = {"x0": "gx", "x1": "gx * 0.5" if x1_grad else "None"}
        bwd.append(f"return {', '.join(grads.get(a, 'None') for a in args)}")

        calls = ch.integer(3, 5)
        data = self.data(calls, numel, dims)
        return Case(self.render(args, fwd, bwd, shape, x1_grad, data), tuple(dict.fromkeys(self.features)))

    def render(self, args: list[str], fwd: list[str], bwd: list[str], shape: tuple[int, ...],
               x1_grad: bool, data: _Data) -> str:
        out = ["import torch", "", "",
               "class Fuzz(torch.autograd.Function):", "    @staticmethod",
               f"    def forward(ctx, {', '.join(args)}):"]
        out += ["        " + line for line in fwd]
        out += ["", "    @staticmethod", "    def backward(ctx, g):"]
        out += ["        " + line for line in bwd]
        out += ["", "",
                f"SHAPE = {shape!r}", f"X0 = {data.x0!r}", f"X1 = {data.x1!r}", f"N = {data.n!r}",
                f"SIZES = {data.sizes!r}", f"D = {data.d!r}", f"K = {data.k!r}",
                f"LOSS_WEIGHT = {data.weight!r}", f"STEPS = {[(i, i) for i in range(len(data.x0))]!r}",
                "CALL = 0", "", "",
                "def set_value(value):", "    global CALL", "    CALL = int(value)", "", "",
                "def read_state():", "    return {}", "", "",
                "def loss_weight():", "    return LOSS_WEIGHT[CALL]", "", "",
                "def make_args():",
                "    x0 = torch.tensor(X0[CALL]).reshape(SHAPE).requires_grad_(True)"]
        made = {"x1": f"torch.tensor(X1[CALL]).reshape(SHAPE){'.requires_grad_(True)' if x1_grad else ''}",
                "n": "torch.tensor(N[CALL])", "sizes": "torch.tensor(SIZES[CALL])",
                "d": "torch.tensor(D[CALL])", "k": "K[CALL]"}
        out += [f"    {a} = {made[a]}" for a in args[1:]]
        out += [f"    return ({''.join(a + ', ' for a in args).rstrip(' ')})", ""]
        return "\n".join(out)


def generate_data_case(ch: Chooser) -> Case:
    """A random Function taking Python values out of tensor data (see the module docstring)."""
    return _DataBuilder(ch).build()


if __name__ == "__main__":
    import sys

    from generate import print_cases

    print_cases(generate_data_case, sys.argv)
