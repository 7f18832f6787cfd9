"""The one place model (issue 28): ``spec.Place`` is a root plus steps, for every user of it."""

from __future__ import annotations

import types

import torch

from minihop.spec import MISSING, Place, Root
from minihop.tracer.routes import closure_routes

_G: dict[str, object] = {}
_W = torch.nn.Linear(2, 2)


def test_a_place_in_an_argument_reads_writes_and_spells_like_the_user() -> None:
    obj = types.SimpleNamespace(d={"k": [1, 2]})
    place = Place(Root("arg", 1), (("attr", "d"), ("key", "k"), ("item", 0)))
    assert place.get((None, obj)) == 1
    assert place.describe(("x", "obj")) == "obj.d['k'][0]"
    assert place.uses_args and place.step == ("item", 0)
    place.set((None, obj), 5)
    assert obj.d["k"] == [5, 2]
    gone = Place(Root("arg", 1), (("attr", "nothing"),))
    assert gone.get((None, obj)) is MISSING


def test_a_global_root_is_written_into_its_globals_dict() -> None:
    g = globals()
    place = Place(Root("global", "_G", "global _G", lambda args: g.get("_G", MISSING), home=g))
    assert place.get(()) is _G and place.step == ("key", "_G") and place.owner(()) is g
    assert place.description == "global _G" and not place.uses_args
    place.set((), {"new": 1})
    try:
        assert _G == {"new": 1}
    finally:
        place.set((), {})


def test_routes_to_closed_over_tensors_are_places_with_a_cell_root_and_steps() -> None:
    held = {"w": torch.ones(2)}
    lin = _W

    def forward() -> torch.Tensor:
        return held["w"] + lin.weight.sum()

    routes = closure_routes(forward)
    name, place = routes[id(held["w"])]
    assert (place.root.kind, place.root.key, place.steps) == ("cell", "held", (("item", "w"),))
    assert place.describe() == "held['w']"
    held["w"] = torch.zeros(2)  # replaced: the place reads the new one, as eager would
    assert place.get(()) is held["w"]
    _, weight = routes[id(lin.weight)]
    assert weight.steps == (("attr", "weight"),) and weight.get(()) is lin.weight


_SCALE = torch.tensor([2.0, 3.0])


class _Scaled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * _SCALE

    @staticmethod
    def backward(ctx, g):
        return g * _SCALE


def test_a_capture_s_inputs_are_places_in_the_arguments_or_routes() -> None:
    import minihop

    cap = minihop.capture(_Scaled, torch.ones(2, requires_grad=True))
    by_name = {s.name: s for s in cap.pair.inputs}
    x = next(s for s in by_name.values() if s.arg_index == 0)
    assert (x.place.root.kind, x.place.root.key, x.path, x.fetched) == ("arg", 0, (("arg", 0),), False)
    scale = next(s for s in by_name.values() if s.fetched)
    assert (scale.place.root.kind, scale.place.root.key, scale.path) == ("global", "_SCALE", None)
    assert scale.place.get(()) is _SCALE
