import math

import orjson
import pytest

from omniwatch.core.parse import LineError, parse_console_line, parse_jsonl_line, parse_record

from .conftest import SCENARIOS, fixture_path


@pytest.mark.parametrize("name", SCENARIOS)
def test_console_twin_gives_the_same_steps_and_values_as_jsonl(name):
    jsonl = [parse_jsonl_line(line) for line in fixture_path(name).read_bytes().splitlines()]
    console = [parse_console_line(line) for line in fixture_path(name, ".console.log").read_text().splitlines()]
    assert [p.step for p in jsonl] == [p.step for p in console]
    for a, b in zip(jsonl, console):
        assert a.values == b.values
        assert a.dropped == b.dropped == {}


def test_jsonl_keeps_every_numeric_key_of_a_verl_line():
    line = fixture_path("flowgrpo_healthy").read_bytes().splitlines()[0]
    raw = orjson.loads(line)["data"]
    parsed = parse_jsonl_line(line)
    assert parsed.step == 1 and len(parsed.values) == len(raw) == 52
    assert parsed.values["timing_s/gen"] == raw["timing_s/gen"]


@pytest.mark.parametrize("line,reason", [
    (b"garbage", "malformed_json"),
    (b'{"step": 3, "data": {"a": 1', "malformed_json"),
    (b"[1, 2]", "not_object"),
    (b'{"data": {}}', "missing_step"),
    (b'{"step": "x", "data": {}}', "bad_step"),
    (b'{"step": -1, "data": {}}', "bad_step"),
    (b'{"step": true, "data": {}}', "bad_step"),
    (b'{"step": 1.5, "data": {}}', "bad_step"),
    (b'{"step": 1, "data": [1]}', "missing_data"),
    (b'{"step": 1}', "missing_data"),
    (b"\xff\xfe\x00", "malformed_json"),
])
def test_bad_jsonl_lines_are_skipped_with_a_reason(line, reason):
    with pytest.raises(LineError) as e:
        parse_jsonl_line(line)
    assert e.value.reason == reason


def test_bad_values_are_dropped_and_counted_but_the_line_kept():
    p = parse_jsonl_line(b'{"step": 4, "data": {"ok": 1.5, "nan": null, "s": "text", "l": [1], "d": {"x": 1},'
                         b' "b": true, "i": 7}}')
    assert p.values == {"ok": 1.5, "b": 1.0, "i": 7.0}
    assert p.dropped == {"non_finite": 1, "non_numeric": 3}


def test_python_nan_and_inf_from_push_are_non_finite():
    p = parse_record({"step": 1, "data": {"a": math.nan, "b": math.inf, "c": -math.inf, "d": 2}})
    assert p.values == {"d": 2.0} and p.dropped == {"non_finite": 3}


def test_huge_and_endless_keys_are_dropped():
    p = parse_record({"step": 1, "data": {"k" * 10_000: 1.0, "ok": 2.0}})
    assert p.values == {"ok": 2.0} and p.dropped == {"key_too_long": 1}


def test_console_line_with_ray_prefix_and_numpy_reprs():
    p = parse_console_line("(TaskRunner pid=4242) step:12 - actor/loss:np.float64(-0.5) - perf/mfu/actor:0.31 - "
                           "timing_s/gen:1e+02 - note:hello - bad - val-core/ocr/reward/mean@1:0.7")
    assert p.step == 12
    assert p.values == {"actor/loss": -0.5, "perf/mfu/actor": 0.31, "timing_s/gen": 100.0,
                        "val-core/ocr/reward/mean@1": 0.7}
    assert p.dropped == {"non_numeric": 1, "malformed_pair": 1}


@pytest.mark.parametrize("line", ["INFO starting trainer", "", "step: - a:1", "mystep:3 - a:1x"])
def test_other_console_output_is_not_a_step(line):
    with pytest.raises(LineError) as e:
        parse_console_line(line)
    assert e.value.reason == "not_a_step_line"
