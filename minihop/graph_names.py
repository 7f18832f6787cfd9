"""Every rule that names a node of minihop's graphs, in one place.

Place in the pipeline: below every stage (imports nothing from minihop); tracer, rewire and the
program tracer call these instead of spelling a prefix themselves. The names follow Dynamo's,
so that ``minihop.testing.assert_same_graph`` and a reader can compare the two systems' bodies:

  fwd inputs    an argument or what it holds: ``l_`` + its path (``x`` -> ``l_x_``,
                ``params.weight`` -> ``l_params_weight``; ``input_name``); a tensor reached
                through a closure ``l_NAME_``, through a global ``g_NAME_`` (``free_value_root``,
                then ``held_name``/``tensor_name``/``parameter_name`` down to the tensor); a
                tensor reached another way ``lifted_N`` (``lifted_name``)
  size symbols  the ShapeEnv's own (``s0``, ``u0``): ``symbol_name``
  grads         ``grad_N`` unless the user's backward names its argument (``grad_name``); a
                grad backward never reads ``unused_N`` (``unused_grad_name``)
  saved         a bwd input is named as the fwd node it saves (``saved_name``)
  range checks  the nodes checking an unbacked size are named last in a body, as Dynamo's
                runtime-assert pass names them (``late_name``, then ``range_check_name``)
  outer graph   its placeholders ``L_x_`` for ``l_x_`` (``outer_input_name``), its bodies
                ``fwd_body_N``/``bwd_body_N`` (``body_names``), a tensor constant of a traced
                program ``_tensor_constantN`` (``constant_name``)

Invariant: every name is a Python identifier (fx makes it unique in its graph).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["body_names", "constant_name", "free_value_root", "grad_name", "held_name", "ident",
           "input_name", "late_name", "lifted_name", "outer_input_name", "parameter_name",
           "range_check_name", "saved_name", "symbol_name", "tensor_name", "unused_grad_name"]


def ident(text: str) -> str:
    """``text`` as an identifier: other characters become ``_``, a leading digit gets one."""
    text = re.sub(r"\W", "_", str(text))
    return text if text and not text[0].isdigit() else f"_{text}"


def input_name(path: tuple[tuple[str, Any], ...], argnames: tuple[str, ...]) -> str:
    """Dynamo's style of input name: ``x`` -> ``l_x_``; ``weird.b`` -> ``l_weird_b``."""
    parts: list[str] = []
    trailing = True
    for kind, key in path:
        if kind == "arg":
            parts.append(argnames[key] if key < len(argnames) else f"args_{key}")
        else:
            parts.append(str(key))
        trailing = kind in ("arg", "kw", "item", "key")  # an attribute ends without "_"
    return ident("l_" + "_".join(parts) + ("_" if trailing else ""))


def free_value_root(kind: str, name: str) -> str:
    """The root of the names of tensors reached through a closure variable or a global."""
    return f"{'l' if kind == 'closure' else 'g'}_{name}"


def tensor_name(root: str) -> str:
    """A tensor at ``root`` itself (``g_W`` -> ``g_W_``)."""
    return f"{root}_"


def parameter_name(root: str, parameter: str) -> str:
    """A parameter or buffer of the module at ``root`` (``l_lin`` + ``0.weight``)."""
    return f"{root}_{parameter.replace('.', '_')}"


def held_name(root: str, key: Any) -> str:
    """Something held at ``root`` under ``key`` (an index, a dict key, an attribute)."""
    return f"{root}_{''.join(c if c.isalnum() else '_' for c in str(key))}"


def lifted_name(index: int) -> str:
    """A tensor forward reached by no route minihop can name, the ``index``-th fwd input."""
    return f"lifted_{index}"


def symbol_name(symbol: Any) -> str:
    """A size symbol's placeholder: the ShapeEnv's own name for it (``s0``, ``u0``)."""
    return str(symbol)


def grad_name(index: int, user_name: str | None = None) -> str:
    """The grad of fwd output ``index``: the user's backward's parameter name where it has one."""
    return user_name or f"grad_{index}"


def unused_grad_name(count: int) -> str:
    """The ``count``-th grad placeholder backward never reads (Dynamo's ``unused_N``)."""
    return f"unused_{count}"


def saved_name(fwd_name: str) -> str:
    """A saved value's bwd placeholder: the name of the fwd node it saves."""
    return fwd_name


def late_name(index: int) -> str:
    """A placeholder name for a range check's node until the body is complete."""
    return f"_minihop_late_{index}"


def range_check_name(traced_name: str) -> str:
    """A range check's node's final name: its traced name without fx's ``_N`` suffix (fx
    numbers it after every name the body took, as Dynamo's runtime-assert pass does)."""
    return re.sub(r"_\d+$", "", traced_name)


def outer_input_name(name: str) -> str:
    """The outer graph's placeholder for fwd input ``name``: ``l_x_`` -> ``L_x_``."""
    return "L" + name[1:] if name.startswith("l_") else name


def body_names(index: int) -> tuple[str, str]:
    """The ``index``-th Function applied in a graph: its bodies' attribute names."""
    return f"fwd_body_{index}", f"bwd_body_{index}"


def constant_name(index: int) -> str:
    """A tensor a traced program reads that is not a parameter: fx's ``_tensor_constantN``."""
    return f"_tensor_constant{index}"
