"""A user's module of plain state, as a config or registry module is (``import cfg``): the
Functions in ``test_user_module_state.py`` count, log and memoise tensors in it."""

step = 0
scale = 2.0
last = None
HIST: list = []
