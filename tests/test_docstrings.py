"""The docstrings a newcomer reads first are true and come first.

Each public entry point and every ``minihop.testing`` helper carries a short example, and the
examples run here as doctests (so they cannot drift from the code); ``help(minihop)`` opens with
the package docstring and its runnable example, and names the public functions before any
error class (whose inherited exception methods it no longer lists).
"""

from __future__ import annotations

import doctest
import importlib
import pydoc

import pytest

import minihop
import minihop.testing

# Modules whose docstrings hold the examples (the public names are defined there).
MODULES = ("minihop", "minihop.pipeline", "minihop.entries", "minihop.explain",
           "minihop.testing", "minihop.rewire.contract")
# The names issue 33 asks an example of, as a user reaches them.
WITH_EXAMPLES = ("capture", "apply", "function", "captured", "trace", "explain", "load", "check_consistent")


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_run(module_name: str) -> None:
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             extraglobs={"minihop": minihop}, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed in {module_name}"
    assert result.attempted > 0


def test_public_entry_points_have_examples() -> None:
    for name in WITH_EXAMPLES:
        assert ">>> " in (getattr(minihop, name).__doc__ or ""), f"minihop.{name}'s docstring has no example"
    for name in minihop.testing.__all__:
        value = getattr(minihop.testing, name)
        if callable(value) and not isinstance(value, type):
            assert ">>> " in (value.__doc__ or ""), f"minihop.testing.{name}'s docstring has no example"


def test_testing_helpers_hide_themselves_from_tracebacks() -> None:
    """A failing helper's traceback ends at the test's own line (pytest's ``__tracebackhide__``)."""
    for name in minihop.testing.__all__:
        value = getattr(minihop.testing, name)
        if callable(value) and not isinstance(value, type):
            assert "__tracebackhide__" in value.__code__.co_varnames, name


def test_help_opens_with_the_example_and_functions_before_errors() -> None:
    # ``copy``/``pickle`` cache ``__slotnames__`` on a class they copied (an earlier test's
    # capture): not the API's, and help() would list it, so the length would depend on order.
    for value in vars(minihop).values():
        if isinstance(value, type) and "__slotnames__" in vars(value):
            delattr(value, "__slotnames__")
    text = pydoc.render_doc(minihop, renderer=pydoc.plaintext)
    lines = text.split("\n")
    first_example = next(i for i, line in enumerate(lines) if ">>> cap = minihop.capture(" in line)
    assert first_example < 40, "help(minihop) does not open with its example"
    functions = next(i for i, line in enumerate(lines) if line.strip().startswith("capture(F, *args"))
    first_error = next(i for i, line in enumerate(lines) if "class BackwardOutputError" in line)
    assert functions < first_error
    # The errors' inherited exception methods (hundreds of lines before) are not listed.
    assert "with_traceback" not in text
    assert len(lines) < 945, len(lines)  # (a shared module adds a line to PACKAGE CONTENTS; copying.py ~20)
