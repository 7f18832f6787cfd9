"""Random ``torch.autograd.Function``s crossing sizes, non-tensor outputs, transforms and modes, as source text.

The compositional quarter of the fuzzer (``generate.py``: tensor programs; ``generate_state.py``:
Python state; ``generate_data.py``: data-dependent values). The others keep these features
apart; here each case crosses, per choice:

  sizes       the first dimension of ``x`` over 3-5 calls (``SIZES``), changing so that the
              automatic dynamic cache makes it symbolic (a size may repeat: a cache hit).
  outputs     besides the tensor ``y``: ``x.shape[0]`` (int), ``x.shape[0] / 2`` (float),
              ``x.shape[0] // 2``, ``x.shape`` (``torch.Size``), a dict of them, a list, a
              dict set as an attribute on ``y`` (``y.info``), a size added to a global counter.
  style       ctx-first ``forward`` or ``setup_context`` (with ``generate_vmap_rule``), and
              optionally a size kept on ctx (``ctx.n``) that backward reads.
  transform   (setup_context style) ``torch.func.grad``, ``vjp``, ``jacrev``, ``vmap``, or none.
  mode        none, ``no_grad``, ``inference_mode`` (inference tensors), CPU ``autocast``
              (bfloat16), ``create_graph=True`` (double backward) or ``retain_graph=True``
              (backward twice).

The module's interface (``oracle_modes.py``): ``Fuzz``, ``SIZES``, ``MODE``, ``TRANSFORM``,
``make_args(call)`` (deterministic tensors for a call), ``read_state()`` and ``reset_state()``.

Invariant: a case's source depends only on the choices made (a seed reproduces it).
"""

from __future__ import annotations

from generate import Case, Chooser

__all__ = ["BODIES", "EXTRAS", "MODES", "TRANSFORMS", "generate_modes_case"]

# forward's y from (x, w), and backward's grads from g (x: (n, 4), w: (4,)).
BODIES: dict[str, tuple[list[str], list[str]]] = {
    "mul": (["y = x * w"], ["gx = g * w", "gw = (g * x).sum(0)"]),
    "sin": (["y = (x * w).sin()"], ["c = (x * w).cos()", "gx = g * c * w", "gw = (g * c * x).sum(0)"]),
    "tanh": (["y = (x + w).tanh()"], ["t = (x + w).tanh()", "d = g * (1 - t * t)", "gx = d", "gw = d.sum(0)"]),
    "matmul": (["y = x @ torch.diag(w)"], ["gx = g @ torch.diag(w)", "gw = (x * g).sum(0)"]),
    # Round 20: a table an lru_cache helper hands out, written in place by the caller before
    # each call (``make_args``): the graphs read the cache's entry, as eager's code does.
    "cached": (["y = x * (w * table(4))"], ["t = table(4)", "gx = g * (w * t)", "gw = (g * x * t).sum(0)"]),
}
# Non-tensor values forward hands back, as (return-value source, or None for an attribute /
# a state write, and the lines that make it).
EXTRAS: dict[str, tuple[str | None, list[str]]] = {
    "int": ("x.shape[0]", []),
    "float": ("x.shape[0] / 2", []),
    "floordiv": ("x.shape[0] // 2 + 1", []),
    "size": ("x.shape", []),
    "dict": ('{"n": x.shape[0], "half": x.shape[0] / 2, "shape": x.size()}', []),
    "list": ("[x.shape[0], x.shape[1] * 2]", []),
    "attribute": (None, ['y.info = {"n": x.shape[0], "rows": [x.shape[0]]}']),
    "state": (None, ['TOTAL["n"] += x.shape[0]', 'TOTAL["last"] = x.shape[0] * 3']),
}
TRANSFORMS = ("none", "grad", "vjp", "jacrev", "vmap")
MODES = ("none", "no_grad", "inference_mode", "autocast", "create_graph", "retain_graph")


def generate_modes_case(ch: Chooser) -> Case:
    body = ch.choice(sorted(BODIES))
    setup_style = ch.chance(50)
    transform = ch.choice(TRANSFORMS) if setup_style else "none"
    # A transform runs under no mode but autocast's (torch.func under inference_mode is
    # refused by eager itself).
    mode = ch.choice(("none", "autocast")) if transform != "none" else ch.choice(MODES)
    extras = [name for name in sorted(EXTRAS) if ch.chance(30)]
    if transform != "none":
        # Under a transform, returned Python numbers and attributes of a wrapped tensor are
        # outside what torch.func supports in eager itself: keep plain returns only.
        extras = [e for e in extras if e in ("int", "float", "floordiv", "state")]
    keeps_n = ch.chance(40)
    first = ch.integer(3, 6)
    sizes = [first]
    for _ in range(ch.integer(2, 4)):
        sizes.append(ch.choice((sizes[-1], sizes[-1] + 1, sizes[-1] + 3, first + 2)))
    features = (f"body:{body}", "setup_context" if setup_style else "ctx", f"transform:{transform}",
                f"mode:{mode}", *(f"extra:{e}" for e in extras), *(("ctx.n",) if keeps_n else ()))
    return Case(_source(body, setup_style, transform, mode, extras, keeps_n, sizes), features)


def _source(body: str, setup_style: bool, transform: str, mode: str, extras: list[str],
            keeps_n: bool, sizes: list[int]) -> str:
    fwd_lines, bwd_lines = BODIES[body]
    returns = [EXTRAS[e][0] for e in extras if EXTRAS[e][0] is not None]
    lines_after = [line for e in extras for line in EXTRAS[e][1]]
    ret = "y" if not returns else "(y, " + ", ".join(returns) + ")"
    n_extra = len(returns)
    grads_sig = "g" + "".join(f", _e{i}" for i in range(n_extra))
    scale = " * (ctx.n / x.shape[0])" if keeps_n else ""
    out: list[str] = [
        "import functools",
        "import torch",
        "from torch.autograd import Function",
        "",
        "",
        "@functools.lru_cache(maxsize=2)",
        "def table(n):",
        "    return torch.arange(n, dtype=torch.float32) + 1",
        "",
        f"SIZES = {sizes!r}",
        f"MODE = {mode!r}",
        f"TRANSFORM = {transform!r}",
        'TOTAL = {"n": 0, "last": None}',
        "",
        "",
        "def reset_state():",
        '    TOTAL.update(n=0, last=None)',
        "    table.cache_clear()",
        "",
        "",
        "def read_state():",
        "    return {**TOTAL, 'table': tuple(table.cache_info())}",
        "",
        "",
        "def make_args(call):",
        "    gen = torch.Generator().manual_seed(1000 + call)",
        "    x = torch.randn(SIZES[call], 4, generator=gen)",
        "    w = torch.randn(4, generator=gen)",
        "    table(4).add_(0.25)  # (the caller's write into the cached table)",
        "    return x, w",
        "",
        "",
        "class Fuzz(Function):",
    ]
    if setup_style:
        out += ["    generate_vmap_rule = True", "",
                "    @staticmethod", "    def forward(x, w):"]
    else:
        out += ["    @staticmethod", "    def forward(ctx, x, w):",
                "        ctx.save_for_backward(x, w)"]
        if keeps_n:
            out.append("        ctx.n = x.shape[0]")
    out += [f"        {line}" for line in fwd_lines]
    out += [f"        {line}" for line in lines_after]
    out += [f"        return {ret}", ""]
    if setup_style:
        out += ["    @staticmethod", "    def setup_context(ctx, inputs, output):",
                "        x, w = inputs", "        ctx.save_for_backward(x, w)"]
        if keeps_n:
            out.append("        ctx.n = x.shape[0]")
        out.append("")
    out += ["    @staticmethod", f"    def backward(ctx, {grads_sig}):", "        x, w = ctx.saved_tensors",
            "        g = g.to(x.dtype)  # under autocast y (and so g) may be bfloat16"]
    out += [f"        {line}" for line in bwd_lines]
    out += [f"        return gx{scale}, gw", ""]
    return "\n".join(out)
