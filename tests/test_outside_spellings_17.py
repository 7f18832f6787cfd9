"""Hostile spellings, round 17 (issue #28, round 22): what library code reads of its own, and
the user's exception raised by a backward traced again, tried from outside against eager in
strict, apply and fallback mode (``eager_modes.matches_eager``).

Differences from eager before this round:

- a library's constant that its own code reads: ``torch.distributions.Distribution``'s methods
  read ``self._validate_args``, a class attribute that ``Distribution.set_default_validate_args``
  sets (and that a user may set on ``Normal``). torch was bounded whole, and library code a
  Function called was watched only where the user's code could run too: a capture made with
  validation off served a call after it was turned on (no ``ValueError`` where eager raised one),
  in every mode. Library code that runs is now watched wherever the code reaches a library's
  Python function or class, and what it reads of its module's and classes' constants is guarded
  (``tracer.library_ran``), as the names it resolves were;
- the same in the standard library: ``json.JSONEncoder.item_separator``, read by the encoder's
  method;
- a backward traced again for a call (a data-dependent branch went the other way) that raises
  the user's exception with a message built from tensors (``Normal``'s validation, ``f"... {g}"``):
  the message showed fake tensors (``FakeTensor(..., size=())``), where eager's shows the call's
  values. Strict mode refuses it now (MH104, the user's exception chained); fallback runs that
  backward eagerly, whose exception is eager's.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from torch.autograd import Function
from torch.distributions import Distribution, Normal

import minihop
from minihop.errors import UnsupportedOperationError

from eager_modes import matches_eager


def _x(i: int, n: int = 4) -> torch.Tensor:
    return (torch.linspace(-1.0, 1.0, n) + i).requires_grad_()


def _scale(i: int) -> torch.Tensor:
    return torch.tensor(-1.0 if i >= 2 else 1.0)  # invalid from the third call on


@pytest.fixture(autouse=True)
def _validation_restored() -> Any:
    was = Distribution._validate_args
    yield
    Distribution.set_default_validate_args(was)
    Normal.__dict__.get("_validate_args") is not None and delattr(Normal, "_validate_args")


class LogProb(Function):
    """forward builds a ``Normal`` of its arguments (validated where torch's default says so)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return Normal(x, s).log_prob(x + 1)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g, None


def test_default_validation_toggled_between_calls() -> None:
    """``Distribution.set_default_validate_args`` toggled between calls: eager raises
    ``ValueError`` on the fourth call (validation on, scale -1); a capture made with it off
    served that call (NaNs) before."""
    matches_eager(LogProb, lambda i: (_x(i), _scale(i)),
                  between=lambda i: Distribution.set_default_validate_args(i % 2 == 1),
                  reset=lambda: Distribution.set_default_validate_args(True))


def test_validation_set_on_the_subclass() -> None:
    """The flag set on ``Normal`` itself (a subclass's own class attribute)."""
    def between(i: int) -> None:
        Normal._validate_args = i % 2 == 1

    def reset() -> None:
        Normal.__dict__.get("_validate_args") is not None and delattr(Normal, "_validate_args")
    matches_eager(LogProb, lambda i: (_x(i), _scale(i)), between=between, reset=reset)


def test_validation_toggled_before_backward() -> None:
    """backward builds the ``Normal``; the flag toggled between forward and ``.backward()``:
    backward's read is eager's (and its ``ValueError`` eager's text, in fallback mode)."""
    class InBackward(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
            ctx.s = s
            return x * 2

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
            return g * Normal(torch.zeros(()), ctx.s).log_prob(torch.ones(())), None
    matches_eager(InBackward, lambda i: (_x(i), _scale(i)),
                  mid=lambda i: Distribution.set_default_validate_args(i % 2 == 1),
                  reset=lambda: Distribution.set_default_validate_args(True))


def test_explain_lists_the_library_constant() -> None:
    """The flag is an assumption of the capture, named where torch's code reads it."""
    Distribution.set_default_validate_args(False)
    text = str(minihop.explain(minihop.function(LogProb), _x(0), _scale(0)))
    assert "Distribution._validate_args read by forward: == False" in text
    assert "distribution.py" in text


def test_standard_library_class_constant() -> None:
    """``json.JSONEncoder``'s separators, class attributes its methods read (forward encodes,
    backward dumps): changed between calls and before backward."""
    class Encoded(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * len(json.JSONEncoder().encode([1, 2, 3]))

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * len(json.dumps({"a": 1}))

    def between(i: int) -> None:
        json.JSONEncoder.item_separator = ", " if i % 2 == 0 else ","

    def mid(i: int) -> None:
        json.JSONEncoder.key_separator = ": " if i % 2 else ":"
    try:
        matches_eager(Encoded, lambda i: (_x(i),), between=between, mid=mid, refusable=False)
    finally:
        json.JSONEncoder.item_separator, json.JSONEncoder.key_separator = ", ", ": "


class CheckedGrad(Function):
    """backward validates its grad, in a message built from it (a data-dependent branch)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if (g < 0).any():
            raise ValueError(f"negative grad: {g}")
        return g * 2


def _signed(i: int) -> torch.Tensor:
    return torch.linspace(1.0, 2.0, 4) * (-1.0 if i == 2 else 1.0)


def test_backward_exception_text_from_its_grad() -> None:
    """The third call's grad is negative: eager raises ``ValueError("negative grad: tensor([...])")``.
    The backward traced again for it raised the text of a fake grad; strict refuses (MH104)."""
    eager: list[str] = []
    for call in (CheckedGrad.apply, minihop.function(CheckedGrad, fallback="eager")):
        minihop.reset()
        for i in range(4):
            x = _x(i)
            try:
                (call(x) * _signed(i)).sum().backward()
                eager.append(repr(x.grad))
            except ValueError as e:
                eager.append(str(e))
    assert eager[:4] == eager[4:] and eager[2].startswith("negative grad: tensor(")
    strict = minihop.function(CheckedGrad)
    (strict(_x(0)) * _signed(0)).sum().backward()
    with pytest.raises(UnsupportedOperationError, match="fake values") as info:
        (strict(_x(2)) * _signed(2)).sum().backward()
    assert type(info.value.__cause__) is ValueError


def test_redirected_stream_written_through_sys() -> None:
    """The caller redirects ``sys.stderr`` to an ``io.StringIO`` (``contextlib.redirect_stderr``,
    as a test does); forward writes to it through ``sys.stderr.write``, backward prints to it.
    The trace's own write stayed in the buffer (fallback wrote every first line twice): an
    object of a library's reached through a library module, whose method the code calls, is
    watched now as a library module's list is (a real file is refused before tracing)."""
    import contextlib
    import io
    import sys

    class Writes(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            sys.stderr.write(f"forward {x.shape[0]}\n")
            return x * 2

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            print("backward", file=sys.stderr)
            return g
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        matches_eager(Writes, lambda i: (_x(i, 3 + i % 2),), state=buf.getvalue,
                      reset=lambda: (buf.seek(0), buf.truncate()))


def test_saved_capture_carries_the_library_constant(tmp_path: Any) -> None:
    """A saved capture that ran ``Normal``'s code carries ``Distribution._validate_args``: loaded
    where it holds another value, the load refuses (the graphs were made for the saved one);
    loaded where it holds the same, a later change fails the loaded capture's guard."""
    Distribution.set_default_validate_args(False)
    path = str(tmp_path / "logprob.minihop")
    minihop.capture(LogProb, _x(0), _scale(0)).save(path)
    Distribution.set_default_validate_args(True)
    with pytest.raises(minihop.GuardMismatchError, match="_validate_args was False when it was saved"):
        minihop.load(path)
    Distribution.set_default_validate_args(False)
    loaded = minihop.load(path)
    torch.testing.assert_close(loaded(_x(0), _scale(0)), LogProb.apply(_x(0), _scale(0)))
    Distribution.set_default_validate_args(True)
    with pytest.raises(minihop.GuardMismatchError, match="_validate_args"):
        loaded(_x(0), _scale(0))


class _Mine(Normal):
    """A user's distribution, for ``register_kl``."""


def test_register_kl_between_calls() -> None:
    """forward takes ``kl_divergence`` of two of the user's ``Normal`` subclass; the caller
    registers its own KL for that pair before the third call (``register_kl``, which fills
    torch's ``_KL_REGISTRY``). torch's code reads that registry: a capture kept torch's rule."""
    import torch.distributions.kl as kl

    class KL(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return kl.kl_divergence(_Mine(x, torch.ones(4)), _Mine(x * 0, torch.ones(4)))

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g
    saved = dict(kl._KL_REGISTRY)

    def between(i: int) -> None:
        if i == 2:
            kl.register_kl(_Mine, _Mine)(lambda p, q: (p.loc - q.loc).abs())

    def reset() -> None:
        kl._KL_REGISTRY.clear()
        kl._KL_REGISTRY.update(saved)
        kl._KL_MEMOIZE.clear()
    try:
        matches_eager(KL, lambda i: (_x(i),), between=between, reset=reset, refusable=False)
    finally:
        reset()


def _shared_on_odd_calls(i: int) -> tuple[torch.Tensor]:
    t = torch.linspace(-1.0, 1.0, 4) + i
    if i % 2:
        t.share_memory_()  # (as a DataLoader worker's batch, or a tensor shared with a process)
    return (t.requires_grad_(),)


def test_argument_in_shared_memory() -> None:
    """forward asks ``x.is_shared()`` (where its data lives, as ``data_ptr``): a fake copy lives
    in no shared memory (False, where eager answered True on the odd calls), and the key does
    not hold it. Refused now as the argument's storage (MH104); fallback is eager."""
    class ByShared(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * (5.0 if x.is_shared() else 2.0)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g
    matches_eager(ByShared, _shared_on_odd_calls)
    with pytest.raises(UnsupportedOperationError, match="is_shared"):
        minihop.function(ByShared)(_shared_on_odd_calls(1)[0])


def test_library_class_passed_in() -> None:
    """The distribution class is an argument (``dist(x, s)``), the default toggled between calls."""
    class ByClass(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, dist: type, s: torch.Tensor) -> torch.Tensor:
            return dist(x, s).log_prob(x + 1)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
            return g, None, None
    matches_eager(ByClass, lambda i: (_x(i), Normal, _scale(i)),
                  between=lambda i: Distribution.set_default_validate_args(i % 2 == 1),
                  reset=lambda: Distribution.set_default_validate_args(True))


def test_library_function_in_a_list_argument() -> None:
    """``json.dumps`` handed in a list; its encoder's separator set between calls."""
    class ByList(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, fns: list[Any]) -> torch.Tensor:
            return x * len(fns[0]([1, 2, 3]))

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
            return g, None
    try:
        matches_eager(ByList, lambda i: (_x(i), [json.dumps]),
                      between=lambda i: setattr(json.JSONEncoder, "item_separator", "," if i % 2 else ", "))
    finally:
        json.JSONEncoder.item_separator = ", "


class _Encoded(Function):
    """A setup_context Function (torch.func can transform it) whose forward and backward run json's
    encoder: its separator, a class attribute the encoder's method reads, set between calls."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x * len(json.JSONEncoder().encode([1, 2, 3]))

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * len(json.dumps({"a": 1}))


def _transformed(call: Any, transform: str) -> list[Any]:
    out: list[Any] = []
    try:
        for i in range(4):
            json.JSONEncoder.item_separator = "," if i % 2 else ", "
            x = torch.linspace(-1.0, 1.0, 6).view(2, 3) + i
            try:
                if transform == "vmap":
                    out.append(torch.func.vmap(call)(x))
                elif transform == "grad":
                    out.append(torch.func.grad(lambda t: call(t).sum())(x))
                else:
                    leaf = x.clone().requires_grad_()
                    call(leaf).sum().backward()
                    out.append(leaf.grad)
            except minihop.MinihopError:
                out.append("refused")
    finally:
        json.JSONEncoder.item_separator = ", "
    return out


@pytest.mark.parametrize("transform", ["none", "vmap", "grad"])
def test_library_constant_under_transforms(transform: str) -> None:
    """The crossing: the separator toggled between calls, each call under ``vmap``, ``grad`` or
    none; strict equals eager or refuses, fallback equals eager."""
    eager = _transformed(_Encoded.apply, transform)
    for mode in ("strict", "fallback"):
        minihop.reset()
        call = minihop.function(_Encoded) if mode == "strict" else minihop.function(_Encoded, fallback="eager")
        for e, got in zip(eager, _transformed(call, transform), strict=True):
            if isinstance(got, str):
                assert mode == "strict"
                continue
            assert torch.equal(e, got), (transform, mode)


def test_forward_writes_a_library_class_attribute() -> None:
    """forward reads json's separator and sets it (``json.JSONEncoder.item_separator = ...``): a
    library class's attribute the user's code writes. The trace's write stayed made and went
    unseen (the capture then guarded the value it had written, not the one it read). Watched
    now as a library module's namespace is: the change is refused (MH106), fallback is eager."""
    class Flips(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            n = len(json.JSONEncoder().encode([1, 2]))
            json.JSONEncoder.item_separator = "," if n > 5 else ", "
            return x * n

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * len(json.dumps([1, 2]))
    try:
        matches_eager(Flips, lambda i: (_x(i),), state=lambda: json.JSONEncoder.item_separator,
                      reset=lambda: setattr(json.JSONEncoder, "item_separator", ", "))
        with pytest.raises(minihop.MinihopError, match="item_separator"):
            minihop.function(Flips)(_x(0))
        assert json.JSONEncoder.item_separator == ", "  # (put back by the refused trace)
    finally:
        json.JSONEncoder.item_separator = ", "


def test_library_module_written_beside_a_library_call() -> None:
    """Found by round 22's effects run at b904304 (seed 1175206): forward calls a function of a
    library module through it (``torch.nn.functional.mse_loss``), backward bumps a name in that
    module (``torch.nn.functional.k += 1``). The round's watch of library objects whose methods the
    code calls took the module for one, watched it as a user's namespace, and replayed the bump
    as a counter: the trace's own bump stayed, and fallback bumped twice per call. A library
    module is watched as one again (any change refused, put back)."""
    import torch.nn.functional as nnf

    class Bumps(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * 2 + torch.nn.functional.mse_loss(x, torch.zeros_like(x))

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            torch.nn.functional.minihop_round22 += 1
            return g * 2
    nnf.minihop_round22 = 0
    try:
        matches_eager(Bumps, lambda i: (_x(i),), state=lambda: nnf.minihop_round22,
                      reset=lambda: setattr(nnf, "minihop_round22", 0))
        nnf.minihop_round22 = 0
        with pytest.raises(minihop.MinihopError, match="minihop_round22"):
            minihop.function(Bumps)(_x(0))
        assert nnf.minihop_round22 == 0  # (the trace's own bump put back)
    finally:
        del nnf.minihop_round22
