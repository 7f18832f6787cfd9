"""Random ``torch.autograd.Function``s as Python source text, for differential fuzzing.

Shared by ``tests/fuzz/test_fuzz.py`` (hypothesis drives the choices, so failures shrink) and
``bench/fuzz.py`` (a seeded ``random.Random`` drives them, for long runs). Every choice goes
through a ``Chooser``; ``generate_case(chooser)`` returns a ``Case`` whose ``source`` is a
complete module: ``class Fuzz`` (the Function) and ``make_args()`` (its arguments). The source
is real Python that minihop traces, and the whole repro of a failing example.

How a case is built:
  arguments   1-3 tensors (float32/float64/int64, 0-3 dims, some not requiring grad, some
              transposed or expanded, sometimes the same tensor passed twice) mixed with
              non-tensor arguments: a float ``scale``, an int ``k``, a str ``mode`` and a dict
              ``params`` holding a tensor (lifted by minihop, no gradient in eager).
  forward     1-6 statements over a pool of torch ops (elementwise unary/binary with
              broadcasting, reductions with keepdim, matmul, views/reshape/transpose/permute,
              indexing and slicing, casts to float64 and back, cat/stack, factories, in-place
              on intermediates, a branch on ``mode`` or on ``ctx.needs_input_grad``, shapes
              read as ints, tensor constants held by a global or a closure, and, rarely, a
              data-dependent op minihop must refuse). Each statement is run on the example's
              real values while generating (the *probe*), so shapes and dtypes are known and
              only statements eager accepts are kept.
  outputs     a tensor, a tuple (possibly holding ints, None, a nested list), a dict or a user
              object; some outputs ``mark_non_differentiable``; maybe
              ``set_materialize_grads(False)``; ``forward(ctx, ...)`` or ``setup_context`` style.
  saved       through ``save_for_backward`` (sometimes with a ``None`` or a duplicate), ctx
              attributes (single, a tuple, a ``torch.Size``), or both.
  backward    either the true VJP (forward re-run on the saved inputs under
              ``torch.enable_grad()`` and differentiated with ``torch.autograd.grad``) or an
              arbitrary function of the grads and saved values with the right shapes (sometimes
              float64, broadcast-bigger, non-contiguous, or a saved value or grad as it is, as
              eager accepts; a zeros gradient for an integer argument, which eager drops);
              random ``None`` gradients, ``needs_input_grad`` branches, ``g is None``
              branches, a branch on ``g.is_contiguous()``; sometimes ``@once_differentiable``.

Invariant: a case's source depends only on the choices made, so a seed (or hypothesis's
choice sequence) reproduces it exactly.

Functions that read and write Python state (class attributes, argument objects, globals,
closure cells, counters, logs, prints) come from ``generate_state.py``, which shares this
module's ``Chooser`` and ``Case``; the cases made here are unaffected by it.
"""

from __future__ import annotations

import dataclasses
import random
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import torch

__all__ = ["Case", "Chooser", "RandomChooser", "generate_case", "load_case_namespace", "print_cases"]

T = TypeVar("T")

# Probe values larger than this are not kept: the fuzzer is about structure, not size.
_MAX_NUMEL = 256
_PROBE_ATTEMPTS = 12


class Chooser(Protocol):
    """Where every random decision comes from. Simplest options first: choices shrink to them."""

    def integer(self, lo: int, hi: int) -> int: ...

    def choice(self, options: Sequence[T]) -> T: ...

    def chance(self, percent: int) -> bool: ...


class RandomChooser:
    """A ``Chooser`` over ``random.Random(seed)`` (bench/fuzz.py: no shrinking)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def chance(self, percent: int) -> bool:
        return self.rng.randrange(100) < percent


@dataclasses.dataclass(frozen=True)
class Case:
    """One generated Function: its module source and a few facts for the counts."""

    source: str
    features: tuple[str, ...]

    def __repr__(self) -> str:
        return f"Case(features={list(self.features)}):\n{self.source}"


def load_case_namespace(source: str, filename: str) -> dict[str, Any]:
    """Execute a case's source as a module whose code objects point at ``filename``."""
    namespace: dict[str, Any] = {"__name__": "fuzz_case", "__file__": filename}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Arg:
    name: str
    kind: str  # "tensor", "scale", "k", "mode", "params"
    make: str  # source of the value in make_args
    floating: bool = False


def _shape_literal(shape: Sequence[int]) -> str:
    return "(" + "".join(f"{s}, " for s in shape).rstrip(" ") + ")" if shape else "()"


# ---------------------------------------------------------------------------------------------
# The builder
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _ProbeCtx:
    needs_input_grad: tuple[bool, ...]


class _Builder:
    def __init__(self, ch: Chooser) -> None:
        self.ch = ch
        self.features: list[str] = []
        self.args: list[_Arg] = []
        self.probe: dict[str, Any] = {"torch": torch}
        self.values: list[str] = []  # tensor names forward can use (args, then v0, v1, ...)
        self.program: list[str] = []  # forward statements (no indentation)
        self.counter = 0
        self.constants: list[str] = []  # "C0 = torch...." definitions (module globals or closure)
        self.style = "ctx"

    # -- arguments ------------------------------------------------------------------------
    def build_args(self) -> None:
        ch = self.ch
        sizes = ch.choice([(2, 3), (3, 2), (2, 2), (1, 3), (4, 2)])
        n_tensors = ch.integer(1, 3)
        for i in range(n_tensors):
            ndim = ch.choice([1, 2, 2, 3, 0]) if i == 0 else ch.choice([2, 1, 3, 0])
            shape = tuple(ch.choice(sizes) for _ in range(ndim))
            dtype = ch.choice(["float32"] * 6 + ["float64", "int64"])
            if dtype == "int64":
                make = f"torch.randint(-3, 4, {_shape_literal(shape)}, generator=gen)"
                self.args.append(_Arg(f"x{i}", "tensor", make, floating=False))
                self.features.append("int-input")
                continue
            if i > 0 and ch.chance(10):
                # The same tensor object passed again (eager accumulates both gradients).
                self.args.append(_Arg(f"x{i}", "tensor", "x0", floating=self.args[0].floating))
                self.features.append("repeated-input")
                continue
            requires_grad = i == 0 or not ch.chance(25)
            layout = ch.choice(["plain"] * 8 + ["transposed", "expanded"]) if ndim == 2 else "plain"
            if layout == "transposed":
                make = f"torch.randn({_shape_literal(shape[::-1])}, generator=gen, dtype=torch.{dtype}).t()"
            elif layout == "expanded":
                make = (f"torch.randn({_shape_literal((1, shape[1]))}, generator=gen, "
                        f"dtype=torch.{dtype}).expand{shape}")
            else:
                make = f"torch.randn({_shape_literal(shape)}, generator=gen, dtype=torch.{dtype})"
            if layout != "plain":
                self.features.append(f"{layout}-input")
            if requires_grad:
                make += ".requires_grad_(True)"
            else:
                self.features.append("no-grad-input")
            self.args.append(_Arg(f"x{i}", "tensor", make, floating=True))
        if ch.chance(40):
            self.args.append(_Arg("scale", "scale", repr(ch.choice([2.0, 0.5, -1.5]))))
        if ch.chance(30):
            self.args.append(_Arg("k", "k", repr(ch.choice([1, 2, 3]))))
        if ch.chance(25):
            self.args.append(_Arg("mode", "mode", repr(ch.choice(["double", "plain"]))))
        if ch.chance(15):
            shape = (ch.choice(sizes),)
            self.args.append(_Arg("params", "params",
                                  f'{{"w": torch.randn({_shape_literal(shape)}, generator=gen)}}'))
            self.features.append("params-dict")
        created = list(self.args)  # make_args creates them in this order (x0 before a repeat)
        # Shuffle: non-tensor arguments between tensors too.
        order: list[_Arg] = []
        pool = list(self.args)
        while pool:
            order.append(pool.pop(ch.integer(0, len(pool) - 1) if ch.chance(30) else 0))
        self.args = order
        for a in self.args:
            if a.kind != "tensor":
                self.features.append(f"arg-{a.kind}")

        lines = ["def make_args():", "    gen = torch.Generator().manual_seed(0)"]
        lines += [f"    {a.name} = {a.make}" for a in created]
        lines.append(f"    return ({''.join(a.name + ', ' for a in self.args).rstrip(' ')})")
        self.make_args_source = "\n".join(lines)
        namespace: dict[str, Any] = {"torch": torch}
        exec(self.make_args_source, namespace)
        for a, value in zip(self.args, namespace["make_args"](), strict=True):
            self.probe[a.name] = value
            if a.kind == "tensor":
                self.values.append(a.name)

    def arg(self, kind: str) -> _Arg | None:
        return next((a for a in self.args if a.kind == kind), None)

    # -- probing --------------------------------------------------------------------------
    def t(self, name: str) -> torch.Tensor:
        value = self.probe[name]
        assert isinstance(value, torch.Tensor)
        return value

    def try_statement(self, lines: list[str], result: str) -> bool:
        """Run ``lines`` on the probe values; keep them if eager accepts them quietly."""
        snapshot = dict(self.probe)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                with torch.no_grad():
                    exec("\n".join(lines), self.probe)
            value = self.probe[result]
        except Exception:
            self.probe = snapshot
            return False
        if not isinstance(value, torch.Tensor) or value.numel() > _MAX_NUMEL or value.dim() > 4:
            self.probe = snapshot
            return False
        self.program.extend(lines)
        self.values.append(result)
        return True

    def pick(self, pred: Callable[[torch.Tensor], bool] = lambda t: True, recent: bool = True) -> str | None:
        names = [n for n in self.values if pred(self.t(n))]
        if not names:
            return None
        if recent and self.ch.chance(50):
            return names[-1]
        return self.ch.choice(names)

    # -- forward statements ---------------------------------------------------------------
    def step(self) -> None:
        name = f"v{self.counter}"
        families = ["unary"] * 5 + ["binary"] * 4 + ["reduce"] * 3 + ["view"] * 4 + \
            ["index"] * 3 + ["cast"] * 2 + ["matmul"] * 2 + ["cat", "factory", "inplace"]
        if self.arg("scale") or self.arg("k"):
            families += ["scalar"] * 2
        if self.arg("mode"):
            families.append("branch")
        if self.arg("params"):
            families.append("params")
        families += ["shape_int", "data_dependent", "constant"]
        if self.style == "ctx":
            families.append("needs_grad_branch")
        for _ in range(_PROBE_ATTEMPTS):
            family = self.ch.choice(families)
            made = getattr(self, f"op_{family}")(name)
            if made is not None and self.try_statement(made, name):
                self.counter += 1
                self.features.append(family)
                return
        a = self.pick(recent=True)
        assert a is not None
        if self.try_statement([f"{name} = ({a}).float().sin()"], name):
            self.counter += 1
            return
        raise AssertionError(f"generator: no statement applies to {a}")

    def _dim(self, t: torch.Tensor) -> int:
        return self.ch.integer(-t.dim(), t.dim() - 1)

    def op_unary(self, out: str) -> list[str] | None:
        a = self.pick()
        assert a is not None
        t = self.t(a)
        if not t.is_floating_point():
            return [f"{out} = {a}.{self.ch.choice(['float', 'double'])}() * 0.5"]
        expr = self.ch.choice([
            "torch.sin({a})", "{a}.cos()", "torch.tanh({a})", "{a}.sigmoid()", "torch.relu({a})",
            "{a}.abs()", "-{a}", "{a} * {a}", "{a} ** 2", "{a}.exp()", "torch.log1p({a}.abs())",
            "({a}.abs() + 1).sqrt()", "{a}.clamp(-0.5, 0.5)", "torch.nn.functional.gelu({a})",
            "torch.nn.functional.softplus({a})", "torch.erf({a})", "2 - {a}", "1 / ({a}.abs() + 1)",
        ])
        return [f"{out} = {expr.format(a=a)}"]

    def op_scalar(self, out: str) -> list[str] | None:
        a = self.pick(lambda t: t.is_floating_point())
        if a is None:
            return None
        options = []
        if self.arg("scale"):
            options += ["{a} * scale", "{a} + scale", "{a} / scale", "{a}.clamp(min=-abs(scale))"]
        if self.arg("k"):
            options += ["{a} * k", "{a}[..., :k]" if self.t(a).dim() else "{a} + k", "{a} ** k"]
        return [f"{out} = {self.ch.choice(options).format(a=a)}"] if options else None

    def op_binary(self, out: str) -> list[str] | None:
        a = self.pick()
        assert a is not None
        ta = self.t(a)

        def broadcasts(tb: torch.Tensor) -> bool:
            try:
                torch.broadcast_shapes(ta.shape, tb.shape)
                return True
            except RuntimeError:
                return False

        b = self.pick(broadcasts, recent=False)
        if b is None:
            return None
        expr = self.ch.choice([
            "{a} + {b}", "{a} * {b}", "{a} - {b}", "{a} / ({b}.abs() + 1)", "torch.maximum({a}, {b})",
            "torch.where({a} > {b}, {a}, {b})", "torch.atan2({a}, {b})", "({a} > {b}).float()",
            "{a} * {b}.sigmoid()", "torch.hypot({a}, {b})",
        ])
        return [f"{out} = {expr.format(a=a, b=b)}"]

    def op_reduce(self, out: str) -> list[str] | None:
        a = self.pick(lambda t: t.is_floating_point())
        if a is None:
            return None
        t = self.t(a)
        if t.dim() == 0 or self.ch.chance(15):
            expr = self.ch.choice(["{a}.sum()", "{a}.mean()", "{a}.amax()", "{a}.norm()", "{a}.prod()"])
            return [f"{out} = {expr.format(a=a)}"]
        d = self._dim(t)
        kd = self.ch.choice([False, True])
        expr = self.ch.choice([
            "{a}.sum(dim={d}, keepdim={kd})", "{a}.mean({d}, keepdim={kd})", "{a}.amax({d}, {kd})",
            "torch.logsumexp({a}, {d}, keepdim={kd})", "{a}.prod({d}, keepdim={kd})",
            "{a}.max(dim={d}, keepdim={kd}).values", "{a}.max({d})[1]", "{a}.argmax({d})",
            "{a}.softmax({d})", "{a}.log_softmax(dim={d})", "{a}.cumsum({d})",
            "{a}.sort(dim={d})[0]", "{a}.topk(1, dim={d}).values", "{a}.norm(dim={d}, keepdim={kd})",
            "{a}.min({d}, keepdim={kd})[0]",
        ])
        return [f"{out} = {expr.format(a=a, d=d, kd=kd)}"]

    def op_matmul(self, out: str) -> list[str] | None:
        a = self.pick(lambda t: t.is_floating_point() and t.dim() >= 1)
        if a is None:
            return None
        ta = self.t(a)
        if ta.dim() >= 2 and self.ch.chance(40):
            return [f"{out} = {self.ch.choice(['{a} @ {a}.mT', '{a}.mT @ {a}', 'torch.matmul({a}, {a}.transpose(-1, -2))'])}".format(a=a)]

        def fits(tb: torch.Tensor) -> bool:
            return (tb.is_floating_point() and tb.dim() >= 1 and tb.dtype == ta.dtype
                    and (tb.shape[0] if tb.dim() == 1 else tb.shape[-2]) == ta.shape[-1])

        b = self.pick(fits, recent=False)
        if b is None:
            return None
        if ta.dim() == 2 and self.t(b).dim() == 2 and self.ch.chance(30):
            return [f"{out} = torch.mm({a}, {b})"]
        return [f"{out} = {a} @ {b}"]

    def op_view(self, out: str) -> list[str] | None:
        a = self.pick()
        assert a is not None
        t = self.t(a)
        nd = t.dim()
        options = ["{a}.reshape(-1)", "{a}.view(-1)", "{a}.unsqueeze(0)", "{a}.flatten()",
                   "{a}.contiguous()", "{a}.view_as({a})", "{a}.expand(2, *{a}.shape)"]
        if nd >= 1:
            options += ["{a}.unsqueeze(-1)", "{a}.squeeze()", "{a}.squeeze(0)", "{a}.movedim(0, -1)",
                        "{a}.unbind(0)[0]", "{a}.split(1, dim=0)[-1]", "{a}.chunk(2, -1)[0]",
                        "{a}.flip(0)", "{a}.roll(1, 0)", "{a}.unflatten(0, (1, {a}.shape[0]))"]
        if nd <= 2:
            options.append("{a}.t()")
        if nd >= 2:
            perm = list(range(nd))[::-1]
            options += ["{a}.transpose(0, -1)", f"{{a}}.permute{tuple(perm)}", "{a}.mT",
                        f"{{a}}.reshape{tuple(reversed(t.shape))}", "{a}.diagonal()",
                        f"{{a}}.view({t.shape[-1]}, -1)"]
        return [f"{out} = {self.ch.choice(options).format(a=a)}"]

    def op_index(self, out: str) -> list[str] | None:
        a = self.pick(lambda t: t.dim() >= 1)
        if a is None:
            return None
        t = self.t(a)
        options = ["{a}[0]", "{a}[-1]", "{a}[1:]", "{a}[..., None]", "{a}[None]", "{a}[[0, 0]]",
                   "{a}.index_select(0, torch.tensor([0, 0]))", "{a}.narrow(0, 0, 1)", "{a}[::2]",
                   "{a}[torch.tensor([{last}, 0])]"]
        if t.dim() >= 2:
            options += ["{a}[:, :2]", "{a}[:, [1, 0]] if {a}.shape[1] > 1 else {a}[:, [0]]",
                        "{a}[..., 0]", "{a}[1:, None, :1]"]
        return [f"{out} = {self.ch.choice(options).format(a=a, last=t.shape[0] - 1)}"]

    def op_cast(self, out: str) -> list[str] | None:
        a = self.pick()
        assert a is not None
        t = self.t(a)
        if t.dtype == torch.float64:
            expr = self.ch.choice(["{a}.float()", "{a}.to(torch.float32)", "{a}.to(dtype=torch.float32) * 2"])
        else:
            expr = self.ch.choice(["{a}.double()", "{a}.to(torch.float64)", "{a}.type(torch.float64)",
                                   "{a}.double().sin().float()", "{a}.long().float()"])
        return [f"{out} = {expr.format(a=a)}"]

    def op_cat(self, out: str) -> list[str] | None:
        a = self.pick(lambda t: t.dim() >= 1)
        if a is None:
            return None
        ta = self.t(a)
        b = self.pick(lambda t: t.shape == ta.shape and t.dtype == ta.dtype, recent=False)
        if b is None:
            return None
        expr = self.ch.choice(["torch.cat([{a}, {b}], dim={d})", "torch.stack([{a}, {b}])",
                               "torch.stack(({a}, {b}), dim=-1)"])
        return [f"{out} = {expr.format(a=a, b=b, d=self._dim(ta))}"]

    def op_factory(self, out: str) -> list[str] | None:
        a = self.pick(lambda t: t.is_floating_point())
        if a is None:
            return None
        expr = self.ch.choice([
            "{a} + torch.ones_like({a})", "{a} * torch.full_like({a}, 2.0)",
            "{a} + torch.arange({a}.shape[-1], dtype={a}.dtype) if {a}.dim() else {a} + 1",
            "{a} * {a}.new_ones({a}.shape)", "torch.zeros_like({a}) - {a}",
        ])
        return [f"{out} = {expr.format(a=a)}"]

    def op_inplace(self, out: str) -> list[str] | None:
        a = self.pick(lambda t: t.is_floating_point())
        if a is None:
            return None
        t = self.t(a)
        second = self.ch.choice([f"{out}.mul_(2)", f"{out}.add_(1)", f"{out}.clamp_(-1, 1)",
                                 f"{out}[0] = 0.0" if t.dim() else f"{out}.sub_(1)", f"{out}.sin_()"])
        first = self.ch.choice([f"{out} = {a}.clone()", f"{out} = {a} * 1"])
        return [first, second]

    def op_branch(self, out: str) -> list[str] | None:
        a = self.pick(lambda t: t.is_floating_point())
        if a is None:
            return None
        return [f'if mode == "double":', f"    {out} = {a} * 2", "else:", f"    {out} = {a} + 1"]

    def op_params(self, out: str) -> list[str] | None:
        w = self.probe["params"]["w"]
        a = self.pick(lambda t: t.is_floating_point() and t.dim() >= 1 and t.shape[-1] == w.shape[0])
        if a is None:
            return [f'{out} = params["w"] * 2']
        return [f'{out} = {a} * params["w"]']

    def op_constant(self, out: str) -> list[str] | None:
        a = self.pick(lambda t: t.is_floating_point() and t.dim() >= 1)
        if a is None:
            return None
        name = f"C{len(self.constants)}"
        n = self.t(a).shape[-1]
        definition = f"{name} = torch.linspace(-1.0, 1.0, {n}, dtype=torch.{str(self.t(a).dtype).split('.')[1]})"
        exec(definition, self.probe)
        self.constants.append(definition)
        return [f"{out} = {a} * {name}"]

    def op_needs_grad_branch(self, out: str) -> list[str] | None:
        a = self.pick(lambda t: t.is_floating_point())
        if a is None:
            return None
        # Forward may read needs_input_grad too; the probe has no ctx, so take either branch's
        # shape (both are elementwise).
        self.probe.setdefault("ctx", _ProbeCtx(tuple(
            bool(isinstance(self.probe[x.name], torch.Tensor) and self.probe[x.name].requires_grad)
            for x in self.args)))
        return ["if ctx.needs_input_grad[0]:", f"    {out} = {a} * 2", "else:", f"    {out} = {a} - 1"]

    def op_shape_int(self, out: str) -> list[str] | None:
        a = self.pick(lambda t: t.is_floating_point() and t.dim() >= 1)
        if a is None:
            return None
        return [f"{out} = {a} * {a}.shape[0] + {a}.size(-1) + len({a})"]

    def op_data_dependent(self, out: str) -> list[str] | None:
        # Eager runs it; minihop refuses it (MH103). Rare, so refusals stay a minority.
        if not self.ch.chance(20):
            return None
        a = self.pick(lambda t: t.is_floating_point())
        if a is None:
            return None
        return [f"{out} = {self.ch.choice(['{a}[{a} > 0] * 2', '{a} * {a}.sum().item()'])}".format(a=a)]

    # -- the Function ----------------------------------------------------------------------
    def build(self) -> Case:
        ch = self.ch
        self.build_args()
        self.style = "setup_context" if ch.chance(20) else "ctx"
        for _ in range(ch.integer(1, 6)):
            self.step()
        outputs = self.build_outputs(self.style)
        style = self.style
        self.features.append(f"style-{style}")
        materialize = not ch.chance(25)
        if not materialize:
            self.features.append("materialize-false")
        backward_kind = "vjp" if ch.chance(50) else "arbitrary"
        self.features.append(f"backward-{backward_kind}")
        saving = self.build_saving(style, outputs, backward_kind)
        once = ch.chance(8)
        if once:
            self.features.append("once_differentiable")
        source = self.render(style, outputs, materialize, saving, backward_kind, once)
        return Case(source, tuple(dict.fromkeys(self.features)))

    def build_outputs(self, style: str) -> "_Outputs":
        ch = self.ch
        values = self.values
        if style == "setup_context":
            # Eager refuses saving an input returned as-is when setup_context is overridden.
            inputs = [self.t(a.name) for a in self.args if a.kind == "tensor"]
            values = [v for v in values if not any(self.t(v) is t for t in inputs)]
            if not values:  # every value is an input: forward(ctx, ...) style has no such rule
                self.style = "ctx"
                values = self.values
        n = ch.integer(1, 3)
        chosen = [values[-1]] + [self.ch.choice(values) for _ in range(n - 1)]
        kinds = ["tuple"] * 3 + ["tuple_mixed"] * 2 + ["nested", "dict", "object"]
        kind = ch.choice(["single"] * 3 + kinds) if n == 1 else ch.choice(kinds)
        self.features.append(f"out-{kind}")
        items: list[tuple[str, str]] = []  # (kind, text): "tensor" name, or "const" literal/expr
        if kind in ("single", "tuple", "dict", "object"):
            items = [("tensor", c) for c in chosen]
        elif kind == "tuple_mixed":
            for c in chosen:
                items.append(("tensor", c))
                if ch.chance(60):
                    items.append(("const", ch.choice(["3", "None", "'tag'", "(1, 2)"])))
        else:  # nested: a tensor in a list inside the returned tuple is not an output of F
            items = [("tensor", chosen[0]), ("const", f"[{chosen[-1]}, 1]")]
            for c in chosen[1:-1]:
                items.append(("tensor", c))
        non_diff: list[int] = []
        if kind in ("single", "tuple", "tuple_mixed", "nested") and ch.chance(25):
            candidates = [i for i, (k, _) in enumerate(items) if k == "tensor"]
            if candidates:
                non_diff.append(ch.choice(candidates))
                self.features.append("mark_non_differentiable")
        return _Outputs(kind, items, non_diff)

    def build_saving(self, style: str, outputs: "_Outputs", backward_kind: str) -> "_Saving":
        ch = self.ch
        saving = _Saving()
        if style == "ctx":
            savable = list(dict.fromkeys(self.values))
        else:
            savable = [a.name for a in self.args if a.kind == "tensor"]
            savable += [f"o{i}" for i, (k, _) in enumerate(outputs.items)
                        if k == "tensor" and outputs.kind in ("single", "tuple", "tuple_mixed", "nested")]
        tensors_needed: list[str] = []
        if backward_kind == "vjp":
            tensors_needed = [a.name for a in self.args if a.kind == "tensor"]
            for a in self.args:
                if a.kind != "tensor":
                    saving.plain.append(a.name)
            extra = [s for s in savable if s not in tensors_needed]
            if extra and ch.chance(25):
                tensors_needed.append(ch.choice(extra))
        else:
            for s in savable:
                if ch.chance(35):
                    tensors_needed.append(s)
            for a in self.args:
                if a.kind == "scale" and ch.chance(50):
                    saving.plain.append(a.name)
        how = ch.choice(["sfb", "attr", "mixed", "both", "container"])
        self.features.append(f"save-{how}")
        for s in tensors_needed:
            route = {"sfb": "sfb", "attr": "attr", "container": "container",
                     "both": ch.choice(["sfb", "attr", "twice"]),
                     "mixed": ch.choice(["sfb", "attr"])}[how]
            if route in ("sfb", "twice"):
                saving.sfb.append(s)
            if route in ("attr", "twice"):
                saving.attr.append(s)
            if route == "container":
                saving.container.append(s)
        saving.sfb_call = list(saving.sfb)
        saving.sfb_unpack = list(saving.sfb)
        if saving.sfb and ch.chance(15):
            saving.sfb_call.insert(ch.integer(0, len(saving.sfb_call)), "None")
            saving.sfb_unpack.insert(saving.sfb_call.index("None"), "_none")
            self.features.append("save-None")
        if saving.sfb and ch.chance(15):
            saving.sfb_call.append(saving.sfb[0])
            saving.sfb_unpack.append(f"{saving.sfb[0]}_dup")
            self.features.append("save-duplicate")
        if style == "ctx" and ch.chance(20):
            first = next((a.name for a in self.args if a.kind == "tensor"), None)
            if first is not None:
                saving.shape_of = first
        return saving

    def value_probe(self, name: str, outputs: "_Outputs") -> torch.Tensor:
        """The probe value of a name backward can see (an ``o{i}`` is output item i)."""
        if name.startswith("o") and name[1:].isdigit():
            return self.t(outputs.items[int(name[1:])][1])
        return self.t(name)

    def render(self, style: str, outputs: "_Outputs", materialize: bool, saving: "_Saving",
               backward_kind: str, once: bool) -> str:
        ch = self.ch
        argnames = [a.name for a in self.args]
        returned = outputs.render()
        # -- forward / setup_context
        ctx_lines: list[str] = []
        if style != "ctx":
            ctx_lines.append(f"{''.join(n + ', ' for n in argnames)}= inputs" if len(argnames) > 1
                             else f"{argnames[0]}, = inputs")
            if outputs.kind in ("single",):
                ctx_lines.append("o0 = output")
            elif outputs.kind in ("tuple", "tuple_mixed", "nested"):
                names = [f"o{i}" if k == "tensor" else "_" for i, (k, _) in enumerate(outputs.items)]
                ctx_lines.append(f"{''.join(n + ', ' for n in names)}= output")
        if saving.sfb:
            ctx_lines.append(f"ctx.save_for_backward({', '.join(saving.sfb_call)})")
        for s in saving.attr:
            ctx_lines.append(f"ctx.{s}_a = {s}")
        if saving.container:
            ctx_lines.append(f"ctx.stash = ({''.join(s + ', ' for s in saving.container)})")
        for p in saving.plain:
            ctx_lines.append(f"ctx.{p} = {p}")
        if saving.shape_of:
            ctx_lines.append(f"ctx.{saving.shape_of}_shape = {saving.shape_of}.shape")
        for i in outputs.non_diff:
            ctx_lines.append(f"ctx.mark_non_differentiable({outputs.items[i][1] if style == 'ctx' else f'o{i}'})")
        if not materialize:
            ctx_lines.append("ctx.set_materialize_grads(False)")

        out: list[str] = ["import torch", "", "", "class Box:", "    def __init__(self, **kw):",
                          "        self.__dict__.update(kw)", "", "",
                          "class Fuzz(torch.autograd.Function):", "    @staticmethod"]
        if style == "ctx":
            out.append(f"    def forward(ctx, {', '.join(argnames)}):")
            out += ["        " + line for line in self.program]
            out += ["        " + line for line in ctx_lines]
            out.append(f"        return {returned}")
        else:
            out.append(f"    def forward({', '.join(argnames)}):")
            out += ["        " + line for line in self.program]
            out.append(f"        return {returned}")
            out += ["", "    @staticmethod", "    def setup_context(ctx, inputs, output):"]
            out += ["        " + line for line in ctx_lines]
        out += ["", "    @staticmethod"]
        if once:
            out.append("    @torch.autograd.function.once_differentiable")
        grads = outputs.grad_names()
        star = ch.chance(25)
        if star:
            out.append("    def backward(ctx, *grads):")
            body = [f"{''.join(g + ', ' for g in grads)}= grads"]
        else:
            out.append(f"    def backward(ctx, {', '.join(grads)}):")
            body = []
        body += self.unpack_saved(saving)
        if backward_kind == "vjp":
            body += self.vjp_body(outputs, materialize)
        else:
            body += self.arbitrary_body(outputs, materialize, saving)
        out += ["        " + line for line in body]
        head = out[:8]
        body_lines = out[8:]
        if self.constants and ch.chance(50):
            # Closed-over constants: the Function is made inside a function.
            self.features.append("closure-constants")
            out = head + ["def make_function():"] + ["    " + c for c in self.constants] + [""] + \
                ["    " + line if line else "" for line in body_lines] + ["", "    return Fuzz", "", "",
                                                                          "Fuzz = make_function()"]
        else:
            if self.constants:
                self.features.append("global-constants")
            out = head + self.constants + (["", ""] if self.constants else []) + body_lines
        out += ["", "", self.make_args_source, ""]
        return "\n".join(out)

    def unpack_saved(self, saving: "_Saving") -> list[str]:
        lines = []
        if saving.sfb:
            lines.append(f"{''.join(s + ', ' for s in saving.sfb_unpack)}= ctx.saved_tensors")
        for s in saving.attr:
            lines.append(f"{s}{'_a' if s in saving.sfb else ''} = ctx.{s}_a")
        if saving.container:
            lines.append(f"{''.join(s + ', ' for s in saving.container)}= ctx.stash")
        for p in saving.plain:
            lines.append(f"{p} = ctx.{p}")
        if saving.shape_of:
            lines.append(f"{saving.shape_of}_shape = ctx.{saving.shape_of}_shape")
        return lines

    def vjp_body(self, outputs: "_Outputs", materialize: bool) -> list[str]:
        ch = self.ch
        floating = [a.name for a in self.args if a.kind == "tensor" and a.floating]
        lines = ["with torch.enable_grad():"]
        for x in floating:
            lines.append(f"    {x} = {x}.detach().requires_grad_()")
        lines += ["    " + line for line in self.program]
        pairs = [(name, g) for (k, name), g in zip(outputs.items, outputs.grad_names()) if k == "tensor"
                 and outputs.kind in ("single", "tuple", "tuple_mixed", "nested")]
        lines.append(f"pairs = [(o, g) for o, g in ({''.join(f'({o}, {g}), ' for o, g in pairs)}) "
                     "if g is not None and o.requires_grad]")
        gnames = [f"g{x}" for x in floating]
        lines.append("if pairs:")
        if floating:
            lines.append(f"    {''.join(g + ', ' for g in gnames)}= torch.autograd.grad("
                         f"[o for o, _ in pairs], [{', '.join(floating)}], [g for _, g in pairs], "
                         "allow_unused=True)")
        else:
            lines.append("    pass")
        if floating:
            lines.append("else:")
            lines.append(f"    {''.join(g + ', ' for g in gnames)}= {''.join('None, ' for _ in gnames)}")
        result = []
        for i, a in enumerate(self.args):
            if a.kind == "tensor" and a.floating:
                g = f"g{a.name}"
                r = ch.integer(0, 9)
                if r == 0:
                    result.append("None")
                    self.features.append("none-grad")
                elif r == 1:
                    result.append(f"{g} if ctx.needs_input_grad[{i}] else None")
                    self.features.append("needs_input_grad")
                else:
                    result.append(g)
            else:
                result.append("None")
        lines.append(self.return_line(result))
        return lines

    def return_line(self, result: list[str]) -> str:
        if len(result) == 1 and self.ch.chance(50):
            return f"return {result[0]}"
        if self.ch.chance(10):
            result = result + ["None"]
            self.features.append("extra-none")
        return f"return {''.join(r + ', ' for r in result).rstrip(' ')}"

    def arbitrary_body(self, outputs: "_Outputs", materialize: bool, saving: "_Saving") -> list[str]:
        ch = self.ch
        lines: list[str] = []
        visible: dict[str, torch.Tensor] = {}  # backward-visible tensor names -> probe values
        for s in saving.sfb:
            visible[s] = self.value_probe(s, outputs)
        for s in saving.attr:
            visible[f"{s}{'_a' if s in saving.sfb else ''}"] = self.value_probe(s, outputs)
        for s in saving.container:
            visible[s] = self.value_probe(s, outputs)
        top = outputs.kind in ("single", "tuple", "tuple_mixed", "nested")
        grads_sure: dict[str, torch.Tensor] = {}
        grads_maybe: dict[str, torch.Tensor] = {}
        if top:
            for (k, name), g in zip(outputs.items, outputs.grad_names(), strict=True):
                if k == "tensor":
                    (grads_sure if materialize else grads_maybe)[g] = self.t(name)
        # s: a 0-dim float32 tensor mixing the grads and saved values.
        start = ch.choice(["torch.ones(())", "torch.full((), 0.5)"])
        lines.append(f"s = {start}")
        for g in grads_sure:
            if ch.chance(70):
                lines.append(f"s = s + {g}.float().{ch.choice(['mean', 'sum', 'amax'])}()"
                             if grads_sure[g].numel() else f"s = s + {g}.float().sum()")
        for g in grads_maybe:
            lines += [f"if {g} is not None:", f"    s = s + {g}.float().sum()"]
            self.features.append("g-is-None-branch")
        for g in list(grads_sure)[:1]:
            if ch.chance(15):
                # Reads a property autograd does not fix: minihop checks it per call.
                lines += [f"if {g}.is_contiguous():", "    s = s + 1", "else:", "    s = s - 1"]
                self.features.append("grad-query")
        for v, t in visible.items():
            if ch.chance(50):
                lines.append(f"s = s * {v}.float().mean().tanh()" if t.numel() else f"s = s * 2")
        if "scale" in saving.plain:
            lines.append("s = s * scale")
        pool = {**visible, **grads_sure}
        result: list[str] = []
        for i, a in enumerate(self.args):
            if a.kind == "tensor" and not a.floating and ch.chance(25):
                # A gradient for an integer argument: eager drops it (the input needs none).
                result.append(f"torch.zeros({_shape_literal(tuple(self.t(a.name).shape))})")
                self.features.append("int-input-grad")
                continue
            if a.kind != "tensor" or not a.floating:
                result.append("None")
                continue
            if ch.chance(12):
                result.append("None")
                self.features.append("none-grad")
                continue
            shape = tuple(self.t(a.name).shape)
            same = [v for v, t in pool.items() if tuple(t.shape) == shape]
            base_options = [f"torch.ones({_shape_literal(shape)}) * s", f"s.expand({_shape_literal(shape)})"]
            if same:
                v = ch.choice(same)
                base_options += [f"{v}.float().cos() * s", f"{v} * s", f"({v} + 1) * s"]
                if pool[v].is_floating_point() and ch.chance(25):
                    # A saved value or a grad returned as it is (no op in between).
                    self.features.append("grad-is-a-value")
                    base_options = [v]
            if saving.shape_of == a.name and ch.chance(50):
                base_options = [f"torch.ones({a.name}_shape) * s"]
                self.features.append("shape-attr")
            base = ch.choice(base_options)
            post = ch.choice(["", "", ".double()", ".expand(2, *{shape})", ".contiguous()",
                              ".unsqueeze(0).expand(3, *{shape}) * 0.5"] + (
                [".t().contiguous().t()"] if len(shape) == 2 else []))
            if post:
                self.features.append("grad-post" + post.split("(")[0])
            expr = f"({base}){post.format(shape=_shape_literal(shape))}"
            g = f"grad_{a.name}"
            if ch.chance(20):
                lines += [f"if ctx.needs_input_grad[{i}]:", f"    {g} = {expr}", "else:", f"    {g} = None"]
                self.features.append("needs_input_grad")
            else:
                lines.append(f"{g} = {expr}")
            result.append(g)
        lines.append(self.return_line(result))
        return lines


@dataclasses.dataclass
class _Outputs:
    kind: str
    items: list[tuple[str, str]]
    non_diff: list[int]

    def render(self) -> str:
        texts = [text for _, text in self.items]
        if self.kind == "single":
            return texts[0]
        if self.kind == "dict":
            return "{" + ", ".join(f"'out{i}': {t}" for i, t in enumerate(texts)) + ", 'n': 2}"
        if self.kind == "object":
            return "Box(" + ", ".join(f"out{i}={t}" for i, t in enumerate(texts)) + ", n=2)"
        return "(" + "".join(t + ", " for t in texts).rstrip(" ") + ")"

    def grad_names(self) -> list[str]:
        """One grad per top-level item of forward's return value (eager's rule)."""
        if self.kind in ("single", "dict", "object"):
            return ["g0"]
        return [f"g{i}" for i in range(len(self.items))]


@dataclasses.dataclass
class _Saving:
    sfb: list[str] = dataclasses.field(default_factory=list)
    # What save_for_backward is called with, and the names unpacked from saved_tensors: sfb
    # plus, sometimes, a None and a duplicate.
    sfb_call: list[str] = dataclasses.field(default_factory=list)
    sfb_unpack: list[str] = dataclasses.field(default_factory=list)
    attr: list[str] = dataclasses.field(default_factory=list)
    container: list[str] = dataclasses.field(default_factory=list)
    plain: list[str] = dataclasses.field(default_factory=list)
    shape_of: str | None = None  # ctx.<x>_shape = <x>.shape (a torch.Size attribute)


def generate_case(ch: Chooser) -> Case:
    """A random Function (see the module docstring), as a ``Case``."""
    return _Builder(ch).build()


def print_cases(generate: Callable[[Chooser], Case], argv: Sequence[str]) -> None:
    """Print the cases of seeds 0.. (``argv[1]`` of them, 3 by default), for eyeballing a generator."""
    for seed in range(int(argv[1]) if len(argv) > 1 else 3):
        print(f"# --- seed {seed}")
        print(generate(RandomChooser(seed)).source)


if __name__ == "__main__":
    import sys

    print_cases(generate_case, sys.argv)
