"""No test asserts a wall-clock bound unless it is marked ``timing`` (issue 34 item 4): a bound that holds on an
idle machine and fails on a busy one is a flaky test, so everywhere else a test asserts an order or a count
(the call returned before its worker finished, the process exited before the delivery's timeout) and the
marked set scales its budget with the load (``tests.conftest.budget``).

The heuristic, kept simple: an ``assert`` in a ``test_*`` function (or a helper it defines) that compares
(``<``, ``<=``, ``>``, ``>=``) and mentions either a clock call (``time.monotonic()``, ``time.time()``,
``time.perf_counter()``) or a name that holds an elapsed time (:data:`ELAPSED_NAMES`) is a wall-clock
assertion, unless the comparison is with a name ``deadline`` (a hang guard). Name a new elapsed-time variable
one of these, or add its name here."""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CLOCKS = {"monotonic", "time", "perf_counter", "monotonic_ns", "perf_counter_ns"}
ELAPSED_NAMES = {"took", "elapsed", "lat", "latency", "wall_s"}
ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _is_clock(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CLOCKS
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "time")


def _clocked(node: ast.AST) -> bool:
    return any(_is_clock(x) or (isinstance(x, ast.Name) and x.id in ELAPSED_NAMES) for x in ast.walk(node))


def timed(assertion: ast.Assert) -> bool:
    """Does this assert compare an elapsed time (the heuristic of the module docstring)? A comparison with a name
    ``deadline`` is a hang guard (``assert time.monotonic() < deadline, "never started"``), not a bound."""
    for c in ast.walk(assertion.test):
        if isinstance(c, ast.Compare) and any(isinstance(op, ORDER) for op in c.ops):
            sides = [c.left, *c.comparators]
            if any(isinstance(x, ast.Name) and x.id == "deadline" for x in sides):
                continue
            if any(_clocked(x) for x in sides):
                return True
    return False


def _marks(decorators) -> set[str]:
    out = set()
    for d in decorators:
        d = d.func if isinstance(d, ast.Call) else d
        if isinstance(d, ast.Attribute) and isinstance(d.value, ast.Attribute) and d.value.attr == "mark":
            out.add(d.attr)
    return out


def _module_marks(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            value = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            return _marks(value)
    return set()


def unmarked_timing(source: str, where: str = "") -> list[str]:
    """``file:line test`` of every wall-clock assertion in a test that is not marked ``timing``."""
    tree = ast.parse(source)
    module_timed = "timing" in _module_marks(tree)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.name.startswith("test"):
            continue
        if module_timed or "timing" in _marks(node.decorator_list):
            continue
        out += [f"{where}:{a.lineno} {node.name}" for a in ast.walk(node) if isinstance(a, ast.Assert) and timed(a)]
    return out


def test_no_test_outside_the_timing_marker_asserts_a_wall_clock_bound():
    found = [hit for p in sorted(TESTS.rglob("test_*.py")) for hit in unmarked_timing(p.read_text(), p.name)]
    assert not found, "wall-clock assertions outside @pytest.mark.timing (assert an order or a count): " + ", ".join(found)


def test_the_heuristic_catches_a_bound_and_spares_an_order():
    bound = "import time\ndef test_x():\n    t0 = time.monotonic()\n    f()\n    assert time.monotonic() - t0 < 0.2\n"
    took = "def test_y(s):\n    took = s.sigterm_seconds()\n    assert s.proc.returncode == 0 and took < 2.0\n"
    assert unmarked_timing(bound) == [":5 test_x"] and unmarked_timing(took) == [":3 test_y"]
    assert unmarked_timing("import pytest\n@pytest.mark.timing\n" + took) == []
    assert unmarked_timing("import pytest\npytestmark = [pytest.mark.timing]\n" + bound) == []
    order = "def test_z(p):\n    p.stop()\n    assert p.join_timeout < 60 and not p._thread.is_alive()\n"
    assert unmarked_timing(order) == []
    guard = "import time\ndef test_w():\n    deadline = time.monotonic() + 60\n    assert time.monotonic() < deadline, 'hung'\n"
    assert unmarked_timing(guard) == []
