"""``fallback="eager"`` after forward ran captured: the user's backward run for real for a call.

Place in the pipeline: runtime (never imports the tracer). The pipeline hands a capture made
for a ``fallback="eager"`` cache an ``EagerRunner`` around the tracer's ``EagerBackward`` (which
rebuilds, for one call, the ctx eager's forward would have left, and runs the user's backward
on it). Two places use it, each where the captured backward cannot stand for eager's:

- backward traced again for a call is refused (``with_eager_fallback``: the retracer then gives
  a variant that runs backward eagerly for that call, served once);
- the caller touched the user's attributes on ``y.grad_fn`` (read a tensor or container there,
  or set one to another value): ``runtime.grad_fn`` runs that call's backward eagerly, on the
  ctx the caller touched.

Eager would run the user's backward in both cases; strict mode refuses them (a coded error).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..errors import MinihopError, UnsupportedOperationError, notice, shows_fakes
from ..spec import KeepsUserCtx, Pair, ServedOnce
from .backwards import EagerVariant

__all__ = ["EagerRunner", "refusing_fake_text", "with_eager_fallback"]


class EagerRunner:
    """The user's backward for one capture, as the runtime calls it.

    ``ctx(call_args, saved, reason)``: eager's ctx for a call, from its bound arguments and this
    capture's saved values. ``run(ctx, grads)``: the user's backward on it, with one grad per
    fwd output; one gradient per fwd input (None for lifted inputs, as in eager).
    """

    def __init__(self, eager: Any, pair: Pair) -> None:
        self.eager = eager
        self.name = pair.function_name
        self.saved_nodes = pair.saved_fwd_nodes
        self.num_inputs = len(pair.inputs)
        self.num_outputs = len(pair.top_level)
        # The gradient of forward argument i goes to the fwd input that is that argument.
        self.to_input = {s.arg_index: p for p, s in enumerate(pair.inputs)
                         if s.arg_index is not None and s.dim is None}
        self.warned = False

    def ctx(self, call_args: tuple[Any, ...], saved: Sequence[Any], reason: str) -> Any:
        self.warn(reason)
        return self.eager.rebuild(call_args, dict(zip(self.saved_nodes, saved, strict=True)), reason)

    def run(self, ctx: Any, grads: Sequence[Any]) -> tuple[Any, ...]:
        found: list[Any] = [None] * self.num_inputs
        for i, g in enumerate(self.eager.run(ctx, grads)):
            p = self.to_input.get(i)
            if p is not None:
                found[p] = g
            elif g is not None:  # eager's autograd refuses it the same way
                raise RuntimeError(f"function {self.name}Backward returned a gradient different than None "
                                   f"at position {i + 1}, but the corresponding forward input was not a Variable")
        return tuple(found)

    def warn(self, reason: str) -> None:
        """Once per capture, as the forward's fallback warns once per Function."""
        if not self.warned:
            self.warned = True
            notice(f"minihop: running {self.name}.backward eagerly for a call "
                          f"(fallback='eager'): {reason}", stacklevel=3)


def with_eager_fallback(traced: Callable[..., tuple[Any, ...]], runner: EagerRunner) -> Callable[..., tuple[Any, ...]]:
    """``traced`` (a ``Retrace``), or where it is refused, a variant that runs the user's
    backward eagerly for this call (its writes are the user's code's own; never filed)."""
    identity_saved = tuple(range(len(runner.saved_nodes)))
    identity_inputs = tuple(range(runner.num_inputs))

    def retrace(layout: Any, call_args: tuple[Any, ...], grads: Sequence[Any], saved: Sequence[Any],
                grad_mode: bool = False, ctx_state: dict[str, Any] | None = None) -> tuple[Any, ...]:
        try:
            return traced(layout, call_args, grads, saved, grad_mode, ctx_state)
        except MinihopError as refused:
            reason = refused.found
        except Exception as raised:
            # The user's code raised while traced, with a message that shows fake values: eager
            # decides, its own exception or none. (Another exception is eager's, its writes
            # before it made, as eager's are: it propagates.)
            if not shows_fakes(raised):
                raise
            reason = f"backward, traced again for this call, raised {type(raised).__name__} with fake values in its text"

        held: list[Any] = []  # the user's ctx it ran on, kept for the call's later backwards

        def run(*values: Any) -> tuple[Any, ...]:
            n = runner.num_outputs
            real_ctx = runner.ctx(call_args, values[n:], reason)
            for name, value in (ctx_state or {}).items():  # what an earlier backward of the call left
                setattr(real_ctx, name, value)
            held.append(real_ctx)
            return runner.run(real_ctx, values[:n])

        return (EagerVariant(run), identity_saved, identity_inputs,
                (ServedOnce((f"backward ran eagerly: {reason}",)), KeepsUserCtx(held)), ())

    return retrace


def refusing_fake_text(traced: Callable[..., tuple[Any, ...]], name: str) -> Callable[..., tuple[Any, ...]]:
    """``traced`` (a ``Retrace``, strict mode: no eager backward to run), where the user's code,
    traced again for a call, raises an exception whose text shows a traced value (a fake tensor's
    repr or class name, ``Normal(loc: FakeTensor(...))``): not eager's exception, whose text shows
    the call's values. Refused (MH104), the user's exception chained; others propagate as eager's."""

    def retrace(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
        try:
            return traced(*args, **kwargs)
        except MinihopError:
            raise
        except Exception as raised:
            if not shows_fakes(raised):
                raise
            raise UnsupportedOperationError(
                f"{name}.backward, traced again for this call, raised {type(raised).__name__} with a message "
                f"that shows fake values: {str(raised)[:200]!r}.",
                "minihop traces backward on fake tensors; eager's backward, run on this call's values, "
                "raises with its own text (or does not raise).",
                f"Run it eagerly with minihop.function({name}, fallback='eager'), which runs backward "
                "eagerly for such a call.") from raised

    return retrace


def saved_from_ctx(layout: Any, ctx: Any) -> list[Any]:
    """This capture's saved values, from the runtime's ctx (``bodies.Layout``'s places)."""
    unpacked = ctx.saved_tensors if layout.ctx_refs else ()
    if layout.all_via_ctx:
        return list(unpacked)
    stash = ctx.minihop_stash if layout.stashed else ()
    where = {i: unpacked[p] for i, p in layout.from_ctx}
    where.update({i: stash[k] for k, i in enumerate(layout.stashed)})
    return [where.get(i) for i in range(layout.num_saved)]
