"""Issue 35 (hardening IV), inputs that cost too much: long words (item 2: the redaction regexes, the webhook on
the event loop) and the trainer-config files (items 4 and 7: chosen by name and size before parsing, a fast
loader, the newest first, bounded and keyed as runs are).

Costs are shown by what was parsed or asked (sizes and counts recorded by spies), never by a speed; the one CPU
budget (a subprocess limited by RLIMIT_CPU) allows ~100x what the linear regexes need and a small fraction of
what the backtracking ones took. Each attack has its control."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest

from omniwatch import trainer_config as tc
from omniwatch.core.model import RunStore
from omniwatch.core.parse import parse_record

from .conftest import fixture
from .test_faults import serve  # noqa: F401 (a fixture)

# --- item 2: regexes over outside input are linear; nothing heavy on the event loop --------------------------------
_REDACT_BUDGET = """
import resource, sys
from omniwatch.redact import is_secret_key, redact, redact_tree
resource.setrlimit(resource.RLIMIT_CPU, (6, 6))   # CPU seconds; SIGXCPU ends the process past them
words = ["a" * 64000, "A" * 64000, "a." * 32000, "a_1" * 21000, 'token="' * 9000, "a%" * 32000, "a:" * 32000,
         "token=" * 10000, "http://a." * 8000, "password: " + "x " * 30000, "-" * 64000]
for w in words:
    redact(w)
    is_secret_key(w)
redact_tree({"annotations": {"description": " ".join(words[:3])}})
print("ok")
"""


def test_redaction_of_64k_character_words_is_linear():
    """Before: the assignment pattern (``[A-Za-z0-9_.-]*`` around a secret word) and the percent-run pattern
    backtracked from every position: 16,000 characters took 8 s (4,000: 0.5 s), 64,000 minutes. Now every
    pattern starts only where a word starts and takes runs whole: these eleven 64k-character shapes fit in a few
    CPU seconds together. Control: test_redact.py / test_redact_shapes.py (every credential shape still goes)."""
    r = subprocess.run([sys.executable, "-c", _REDACT_BUDGET], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-500:])


@pytest.mark.integration
def test_a_webhook_with_a_64k_character_word_holds_neither_the_event_loop_nor_the_webhook(serve):
    """Before: a 16,000-character word in an annotation froze the exporter's event loop ~16 s (redaction on the
    loop). Now the body is judged in a worker thread with linear regexes: /healthz answers while it is posted and
    the webhook is stored. Control: the annotation's secret is still redacted."""
    s = serve([], env={"OMNIWATCH_WEBHOOK_TOKEN": "w-token-0123456789"})
    body = {"version": "4", "groupKey": "g", "status": "firing", "receiver": "r", "groupLabels": {},
            "commonLabels": {"alertname": "X"}, "commonAnnotations": {}, "externalURL": "http://am",
            "alerts": [{"status": "firing", "labels": {"alertname": "X"}, "startsAt": "2026-12-01T00:00:00Z",
                        "annotations": {"description": "a" * 64000 + " token=" * 2000 + " HF_TOKEN=hf_" + "b" * 34}}]}
    health: list[int] = []
    t = threading.Thread(target=lambda: health.extend(
        httpx.get(s.url + "/healthz", timeout=10).status_code for _ in range(5)))
    t.start()
    r = httpx.post(s.url + "/api/v1/alertmanager", json=body, headers={"authorization": "Bearer w-token-0123456789"},
                   timeout=30)
    t.join(30)
    assert r.status_code == 200 and health == [200] * 5
    stored = httpx.get(s.url + "/api/v1/alerts", timeout=10).text
    assert "hf_" + "b" * 34 not in stored and "[redacted]" in stored


# --- item 4: config files chosen by name and size before parsing; a fast loader --------------------------------------
class _Parses:
    """Spies on the parsers: the size of every text they were given."""

    def __init__(self, monkeypatch):
        self.sizes: list[int] = []
        for name in ("parse_yaml_text", "parse_pprint_text", "parse_json_bytes"):
            real = getattr(tc, name, None)
            if real is None:
                continue

            def spy(text, _real=real):
                self.sizes.append(len(text))
                if len(text) > tc.MAX_BYTES // 2:
                    raise tc.ConfigError("config_too_large")   # do not spend the 20 s the unfixed code did
                return _real(text)
            monkeypatch.setattr(tc, name, spy)


def _config_print(experiment: str) -> bytes:
    text = fixture("trainer_config/finished_on_cadence.pprint.log").read_bytes()
    return text.replace(b"'finished_on_cadence'", repr(experiment).encode())


def test_config_files_are_chosen_by_name_and_size_before_anything_parses_them(tmp_path, monkeypatch):
    """Before: every .yaml/.yml/.json/.log/.txt/.out under a --trainer-config DIR was parsed with PyYAML's
    pure-Python loader: an 8 MB data file cost ~20 s of CPU and ~700 MB, at start and after each change. Now a
    directory walk reads Hydra's config.yaml, YAML / JSON named *config* (up to 1 MiB, libyaml / orjson) and the
    head of console logs, again only when that head changed. Control: the configs among them are all read."""
    parses = _Parses(monkeypatch)
    out = tmp_path / "outputs" / "2026-12-03" / "10-00-00"
    (out / ".hydra").mkdir(parents=True)
    (out / ".hydra" / "config.yaml").write_bytes(fixture("trainer_config/v1_separate_async.hydra/config.yaml").read_bytes())
    (out / "val_generations.json").write_bytes(b'{"x": "' + b"y" * (8 << 20) + b'"}')     # data: not a config by name
    (out / "big_config.yaml").write_bytes(b"trainer: {}\n# " + b"z" * (8 << 20) + b"\n")   # a config by name, too big
    log_path = out / "train.log"
    log_path.write_bytes(_config_print("from_the_log") + b"step:1 - a:1\n" * 200_000)   # ~3 MB, the print at its head
    store = RunStore()
    loaders = []
    import yaml
    real_load = yaml.load
    monkeypatch.setattr(yaml, "load", lambda text, Loader: loaders.append(Loader) or real_load(text, Loader=Loader))
    watch = tc.ConfigWatch(store, [str(tmp_path)])
    assert watch.scan_once() == 2
    assert parses.sizes and max(parses.sizes) <= getattr(tc, "CONSOLE_HEAD_BYTES", 1 << 20)  # nothing bigger than a head was parsed
    assert loaders and all(getattr(L, "__name__", "") == "CSafeLoader" for L in loaders)
    assert ("whole_run", "from_the_log") in store.trainer_configs and \
        ("whole_run", "v1_separate_async") in store.trainer_configs
    assert store.errors[(tc.SOURCE, "config_too_large")] == 1   # the oversize config, once
    # the log grows past its head with every step: its config is not read again
    n = len(parses.sizes)
    with open(log_path, "ab") as f:
        f.write(b"step:2 - a:1\n" * 1000)
    assert watch.scan_once() == 0 and len(parses.sizes) == n


# --- item 7: the walk prefers the newest and says where it stops; configs bounded and keyed like runs -----------------
def test_the_config_walk_reads_the_newest_hydra_outputs_first_and_says_where_it_stopped(tmp_path, caplog):
    """Before: the walk kept the first 256 subdirectories per directory in name order (2,000 in all) and said
    nothing: over 300 days of Hydra's outputs/<date>/<time>/ the newest config was never read and an old one of the
    same experiment (total 5) finished today's run at step 12. Now directories are walked newest first, the newest
    config of a run wins, and the cut is logged once. Control: the newest is read and the stop is said once."""
    base = time.time() - 300 * 86400
    for day in range(300):
        d = tmp_path / "outputs" / f"d{day:03d}" / "10-00-00"
        (d / ".hydra").mkdir(parents=True)
        total = 1000 if day == 299 else 5
        (d / ".hydra" / "config.yaml").write_text(
            f"trainer:\n  project_name: p\n  experiment_name: reused\n  total_training_steps: {total}\n")
        for x in (d / ".hydra" / "config.yaml", d / ".hydra", d, d.parent):
            os.utime(x, (base + day * 86400, base + day * 86400))
    store = RunStore()
    watch = tc.ConfigWatch(store, [str(tmp_path / "outputs")])
    with caplog.at_level(logging.WARNING, logger="omniwatch.trainer_config"):
        watch.scan_once()
        watch._seen.clear()
        watch.scan_once()
    assert store.trainer_configs[("p", "reused")].total_steps == 1000
    said = [r.getMessage() for r in caplog.records if "newest" in r.getMessage()]
    assert len(said) == 1 and "256 newest of 300" in said[0]


def _cfg_file(path, experiment: str, mtime: float, total: int = 100) -> None:
    path.write_text(f"trainer:\n  project_name: p\n  experiment_name: {experiment}\n  total_training_steps: {total}\n")
    os.utime(path, (mtime, mtime))


def test_old_configs_make_room_for_a_new_runs_config(tmp_path):
    """Before: at most 4 x --max-runs configs were kept and none was ever dropped: 300 old experiments refused a new
    run's config. Now the oldest config of a run that does not exist makes room (counted). Control: a config of a
    run that exists is never the one dropped."""
    store = RunStore(max_runs=2)   # 8 configs
    store.ingest("p", "live", parse_record({"step": 1, "data": {"timing_s/step": 1.0}}), "jsonl")
    old = time.time() - 86400
    _cfg_file(tmp_path / "live.config.yaml", "live", old - 10)
    for i in range(20):
        _cfg_file(tmp_path / f"old{i:02d}.config.yaml", f"old{i:02d}", old + i)
    _cfg_file(tmp_path / "new.config.yaml", "new", time.time())
    tc.ConfigWatch(store, [str(tmp_path)]).scan_once()
    assert ("p", "new") in store.trainer_configs and ("p", "live") in store.trainer_configs
    assert len(store.trainer_configs) <= 8 and store.errors[(tc.SOURCE, "config_evicted")] >= 1
    assert store.runs[("p", "live")].config is not None


def test_a_long_experiment_name_meets_its_config(tmp_path):
    """Before: the config was keyed by the first 128 characters of the name, the run by its hashed label: an
    experiment name over 128 characters never met its config. Control: a short name, as before."""
    long = "sweep_" + "lr3e-4_" * 40
    for name in (long, "short"):
        _cfg_file(tmp_path / f"{name[:20]}.config.yaml", name, time.time(), total=77)
    store = RunStore()
    tc.ConfigWatch(store, [str(tmp_path)]).scan_once()
    for name in (long, "short"):
        store.ingest("p", name, parse_record({"step": 1, "data": {"timing_s/step": 1.0}}), "jsonl")
    assert len(long) > 128
    assert all(r.config is not None and r.config.total_steps == 77 for r in store.runs.values())


def test_a_foreign_line_with_an_unclosed_bracket_inside_the_config_print_does_not_swallow_it():
    """Before: a line of another process (a raylet warning with ``[``) printed inside the config print kept the
    block open: the print (and the next) was never read. Control: the print without the foreign line."""
    lines = fixture("trainer_config/finished_on_cadence.pprint.log").read_text().splitlines()
    clean = tc.parse_pprint_text("\n".join(lines))
    for prefix, foreign in (("", "W1203 10:00:00.000 1234 raylet.cc:99] lease [unclosed"),
                            ("(TaskRunner pid=4242) ", "(raylet) [2026-12-03 10:00:00,000 W 99] spilled [objects")):
        text = "\n".join([prefix + ln for ln in lines[:100]] + [foreign] + [prefix + ln for ln in lines[100:]])
        assert tc.parse_pprint_text(text) == clean


def test_absurd_node_counts_are_no_gpu_count():
    """Before: ``nnodes: 1000000000`` x ``n_gpus_per_node: 1000000000`` passed the bounds: 10^18 GPUs in the
    ledger. Control: 4 x 8 is 32."""
    d = {"trainer": {"project_name": "p", "experiment_name": "e", "nnodes": 10**9, "n_gpus_per_node": 10**9}}
    assert tc.facts(d, "yaml").gpus is None
    d["trainer"].update(nnodes=4, n_gpus_per_node=8)
    assert tc.facts(d, "yaml").gpus == 32
