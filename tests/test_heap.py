"""The heap watch's rule table (tracer/heap.py): every row is reachable, and a change no row
foresaw is refused, never replayed. (The rows' behaviour against eager is tested by
test_python_state.py and test_effects.py; this file checks the table's shape.)"""

from __future__ import annotations

import torch

from minihop.spec import MISSING
from minihop.tracer import heap
from minihop.tracer.heap import Change


class _Thing:
    pass


# One change per row, in the table's order: each must be classified by its own row, so no row
# is shadowed by one above it.
SAMPLES = {
    "a random generator or iterator moved": Change("hidden", ("whole", None), 1, 2),
    "a process setting changed": Change("process", ("attr", "sys.getrecursionlimit()"), 1000, 1001),
    "a dict keyed by the user's hashable objects changed": Change("pairs", ("whole", None), (), ((object(), 1),)),
    "a library object's own state changed": Change("list", ("extend", None), None, [1], library=True),
    "an entry keyed by a tensor": Change("dict", ("item", torch.zeros(1)), MISSING, 3),
    "Python values appended": Change("list", ("extend", None), None, [1, "a", (2, 3.0)]),
    "objects appended": Change("list", ("extend", None), None, [_Thing()]),
    "a counter incremented by a whole number": Change("attrs", ("attr", "calls"), 1, 2, increment=True),
    "a counter incremented otherwise": Change("attrs", ("attr", "total"), 1, 1.5, increment=True),
    "a Python value set": Change("attrs", ("attr", "mode"), "a", "b"),
    "deleted": Change("dict", ("item", "k"), 1, MISSING),
    "a fresh container of constants set": Change("attrs", ("attr", "meta"), None, {"seen": []}),
    "a tensor put": Change("dict", ("item", "k"), None, [torch.zeros(1)]),
    "anything else": Change("attrs", ("attr", "obj"), None, _Thing()),
}


def test_every_rule_is_reached_by_its_own_change() -> None:
    assert [r.name for r in heap.RULES] == list(SAMPLES)
    for name, change in SAMPLES.items():
        assert heap.classify(change).name == name


def test_a_guarded_counter_is_set_not_added() -> None:
    """A guarded place is the same before every call: replaying ``+= 1`` as an add would drift."""
    change = Change("attrs", ("attr", "calls"), 1, 2, guarded=True, increment=True)
    assert heap.classify(change).outcome == "set"


def test_an_unforeseen_change_is_refused() -> None:
    """The last row matches everything and refuses: unknown means unsafe."""
    last = heap.RULES[-1]
    assert last.outcome == "refuse" and last.when(Change("weird", ("whole", None), object(), object()))
    for after in (_Thing(), object(), torch.nn.Linear(1, 1), [_Thing()]):
        assert heap.classify(Change("attrs", ("attr", "x"), None, after)).outcome == "refuse"


def test_a_library_object_is_watched_whole() -> None:
    """What a queue, a buffer or a ``bytearray`` holds is seen (``library_state``): a change
    made by its own methods is a change of the snapshot, and ``restore`` takes it back."""
    import io
    import queue
    q, buf, raw = queue.Queue(), io.StringIO(), bytearray(b"a")
    roots = ()
    before = heap.snapshot(roots, (q, buf, raw), ("q", "buf", "raw"))
    q.put(1)
    buf.write("x")
    raw.extend(b"b")
    after = heap.snapshot(roots, (q, buf, raw), ("q", "buf", "raw"))
    changed = {(was.root.description, was.library) for was, *_ in heap.changes(before, after)}
    assert changed == {("q", True), ("buf", True), ("raw", False)}  # (q: its deque and counter)
    heap.restore(before)
    assert not q.queue and q.unfinished_tasks == 0 and buf.getvalue() == "" and raw == b"a"
