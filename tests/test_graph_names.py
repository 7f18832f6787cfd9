"""The rules that name graph nodes live in one module, ``minihop/graph_names.py``.

The names themselves are checked against Dynamo's by the strict body comparisons
(``tests/test_oracle.py``, ``tests/test_dynamo_words.py``, the sweep); here: the rules give the
names the README and docs/graph_contract.md show, and no other module spells one of them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from minihop import graph_names as names

PACKAGE = Path(__file__).resolve().parents[1] / "minihop"
# The prefixes a graph's node names are built from; spelling one elsewhere is a second rule.
PREFIXES = ("unused_", "grad_", "lifted_", "fwd_body_", "bwd_body_", "_tensor_constant", "_minihop_late_")


@pytest.mark.parametrize(("path", "expected"), [
    ((("arg", 0),), "l_x_"),
    ((("arg", 1), ("attr", "weight")), "l_params_weight"),
    ((("arg", 1), ("item", 0)), "l_params_0_"),
    ((("kw", "scale"),), "l_scale_"),
    ((("arg", 5),), "l_args_5_"),
])
def test_input_names(path: tuple[tuple[str, object], ...], expected: str) -> None:
    assert names.input_name(path, ("x", "params")) == expected


def test_other_names() -> None:
    root = names.free_value_root("global", "W")
    assert (root, names.tensor_name(root)) == ("g_W", "g_W_")
    assert names.tensor_name(names.free_value_root("closure", "w")) == "l_w_"
    assert names.parameter_name("g_lin", "0.weight") == "g_lin_0_weight"
    assert names.held_name("g_D", "w-1") == "g_D_w_1"
    assert [names.grad_name(0), names.grad_name(1, "grad_out"), names.unused_grad_name(0)] == \
           ["grad_0", "grad_out", "unused_0"]
    assert names.outer_input_name("l_x_") == "L_x_" and names.outer_input_name("s0") == "s0"
    assert names.body_names(2) == ("fwd_body_2", "bwd_body_2")
    assert names.range_check_name("_assert_scalar_3") == "_assert_scalar"
    assert names.ident("3d") == "_3d"


def test_no_other_module_spells_a_node_name_prefix() -> None:
    for path in PACKAGE.rglob("*.py"):
        if path.name == "graph_names.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.JoinedStr):  # an f-string building a name from a prefix
                head = node.values[0] if node.values else None
                text = head.value if isinstance(head, ast.Constant) and isinstance(head.value, str) else ""
                found = [p for p in PREFIXES if re.fullmatch(re.escape(p), text)]
                assert not found, (f"{path.relative_to(PACKAGE.parent)}:{node.lineno} builds a "
                                   f"{found[0]}N name; use minihop/graph_names.py")
