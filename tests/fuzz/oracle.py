"""Run one generated ``Case`` against eager and minihop, and say what happened.

Shared by ``tests/fuzz/test_fuzz.py`` and ``bench/fuzz.py``. The verdicts:

  matched     ``minihop.testing.assert_matches_eager`` passed (outputs, every ``.grad``,
              ``requires_grad``, aliasing, the graph contract), and a second call of the same
              capture, with other output weights for the loss, matched eager too (a capture
              must not carry state from one call to the next).
  refused     minihop raised a ``MinihopError`` whose code is documented in
              ``docs/unsupported.md`` and which can be a refusal here (the code is recorded).
  mismatched  a wrong answer: a comparison in ``assert_matches_eager`` or in the second call
              failed.
  crashed     anything else from minihop: another exception type (AttributeError,
              RuntimeError from torch, an ``AssertionError`` raised inside minihop), an
              undocumented code, or a code that cannot be a refusal for a capture called with
              its own arguments (MH301 guard mismatch, MH401 minihop's own pair inconsistent).
  invalid     eager itself fails on the case: the generator's fault, never minihop's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import re
import traceback
import warnings
from typing import Any

import torch

import minihop
from minihop.structure import iter_leaves
from minihop.testing import assert_matches_eager, clone_args

from generate import Case, load_case_namespace

__all__ = ["DOCUMENTED_CODES", "Outcome", "run_case"]

_ROOT = pathlib.Path(__file__).resolve().parents[2]
_MINIHOP_DIR = os.path.dirname(os.path.abspath(minihop.__file__))

DOCUMENTED_CODES = frozenset(re.findall(r"^## (MH\d{3}) ", (_ROOT / "docs" / "unsupported.md").read_text(),
                                        re.M))
# Documented codes that are never a fair refusal when a capture is called with clones of the
# very arguments it was captured for, and checked with check_consistent on its own pair.
_NOT_REFUSALS = {"MH301": "guard mismatch on the capture's own arguments",
                 "MH401": "minihop's own pair breaks the graph contract"}


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The verdict on one case; ``signature`` groups alike failures (bench/fuzz.py)."""

    kind: str
    code: str = ""
    signature: str = ""
    detail: str = ""
    error: BaseException | None = dataclasses.field(default=None, repr=False, compare=False)


def write_case(case: Case, directory: pathlib.Path) -> pathlib.Path:
    """The case's source as a file (so tracebacks and ``inspect`` show the user's lines)."""
    digest = hashlib.sha1(case.source.encode()).hexdigest()[:12]
    path = directory / f"fuzz_{digest}.py"
    if not path.exists():
        path.write_text(case.source)
    return path


def _loss(output: Any) -> torch.Tensor | None:
    total: torch.Tensor | None = None
    for _, leaf in iter_leaves(output):
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad and leaf.is_floating_point():
            term = (leaf * 1.5).sum()
            total = term if total is None else total + term
    return total


class SecondCallMismatch(AssertionError):
    """The capture's second call differs from eager."""


def _weighted_loss(output: Any) -> torch.Tensor | None:
    total: torch.Tensor | None = None
    for i, (_, leaf) in enumerate(iter_leaves(output)):
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad and leaf.is_floating_point():
            term = (leaf * (0.25 + i)).sum()
            total = term if total is None else total + term
    return total


def _second_call(capture: minihop.Capture, fn_cls: type, args: tuple[Any, ...]) -> None:
    """Call the capture again on fresh copies; outputs and grads must equal eager's."""
    eager_args, mine_args = clone_args(args), clone_args(args)
    eager_out = fn_cls.apply(*eager_args)
    mine_out = capture(*mine_args)
    eager_leaves, mine_leaves = list(iter_leaves(eager_out)), list(iter_leaves(mine_out))
    if [p for p, _ in eager_leaves] != [p for p, _ in mine_leaves]:
        raise SecondCallMismatch("second call: output structure differs")
    for (path, e), (_, m) in zip(eager_leaves, mine_leaves, strict=True):
        if isinstance(e, torch.Tensor):
            try:
                torch.testing.assert_close(m, e, equal_nan=True)
            except AssertionError as error:
                raise SecondCallMismatch(f"second call, output {path}: {error}") from None
    eager_loss, mine_loss = _weighted_loss(eager_out), _weighted_loss(mine_out)
    if eager_loss is not None and mine_loss is not None:
        eager_loss.backward()
        mine_loss.backward()
    for (path, e), (_, m) in zip(iter_leaves(eager_args), iter_leaves(mine_args), strict=True):
        if isinstance(e, torch.Tensor):
            if (e.grad is None) != (m.grad is None):
                raise SecondCallMismatch(f"second call, grad of {path}: eager {e.grad}, minihop {m.grad}")
            if e.grad is not None:
                try:
                    torch.testing.assert_close(m.grad, e.grad, equal_nan=True)
                except AssertionError as error:
                    raise SecondCallMismatch(f"second call, grad of {path}: {error}") from None


def _last_minihop_frame(error: BaseException) -> traceback.FrameSummary | None:
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename.startswith(_MINIHOP_DIR)]
    return frames[-1] if frames else None


def _innermost(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "?"
    f = frames[-1]
    return f"{re.sub(r'[0-9]+', 'N', os.path.basename(f.filename))}:{f.name}"


def _signature(error: BaseException) -> str:
    first = (str(error).splitlines() or [""])[0]
    first = re.sub(r"\d+", "N", first)[:120]
    where = _last_minihop_frame(error)
    place = f"{os.path.basename(where.filename)}:{where.name}" if where else "-"
    return f"{type(error).__name__} [{place} -> {_innermost(error)}] {first}"


def _detail(error: BaseException) -> str:
    return "".join(traceback.format_exception(error)[-40:])


def run_case(case: Case, directory: pathlib.Path) -> Outcome:
    """Eager first (an eager failure makes the case invalid), then the differential check."""
    path = write_case(case, directory)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        namespace = load_case_namespace(case.source, str(path))
        fn_cls, make_args = namespace["Fuzz"], namespace["make_args"]
        try:
            out = fn_cls.apply(*clone_args(make_args()))
            loss = _loss(out)
            if loss is not None:
                loss.backward()
        except Exception as error:  # noqa: BLE001 - the generator's fault, reported as such
            return Outcome("invalid", type(error).__name__, _signature(error), _detail(error), error)
        try:
            comparison = assert_matches_eager(fn_cls, *make_args())
            _second_call(comparison.capture, fn_cls, make_args())
        except minihop.MinihopError as error:
            if error.code in _NOT_REFUSALS:
                return Outcome("crashed", error.code, f"{error.code} ({_NOT_REFUSALS[error.code]}) "
                               + _signature(error), _detail(error), error)
            if error.code not in DOCUMENTED_CODES:
                return Outcome("crashed", error.code, f"undocumented {error.code} " + _signature(error),
                               _detail(error), error)
            return Outcome("refused", error.code, f"{error.code} {_signature(error)}", _detail(error), error)
        except SecondCallMismatch as error:
            return Outcome("mismatched", "", _signature(error), _detail(error), error)
        except AssertionError as error:
            where = _last_minihop_frame(error)
            if (where is not None and where.filename.endswith(os.path.join("minihop", "testing.py"))
                    and where.name == "assert_matches_eager" and not str(error).startswith("minihop bug")):
                return Outcome("mismatched", "", _signature(error), _detail(error), error)
            return Outcome("crashed", "", _signature(error), _detail(error), error)
        except Exception as error:  # noqa: BLE001 - any other exception is a minihop crash
            return Outcome("crashed", "", _signature(error), _detail(error), error)
    return Outcome("matched")
