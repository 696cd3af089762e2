"""Issue 25 item 5: notification spoofing. A run directory ``<at id=all><`` holding ``at>.jsonl`` is the run
``<at id=all></at>``: every Feishu card (``lark_md``) @-mentioned everyone. A newline in a file name
planted a fake "Resolved at …" line under a firing alert. Labels lose their control characters at ingest;
every receiver renders labels and annotations as one-line text, Feishu as plain text that forms no tag."""
from __future__ import annotations

import json

import orjson
from fastapi.testclient import TestClient

from omniwatch.core.model import RunStore
from omniwatch.relay.messages import build, render_feishu, render_slack, render_webhook, text
from omniwatch.sources.files import FileSource

from .test_redact import HOOK, relay_app  # noqa: F401  (relay_app is a fixture)

FAKE_LINE = "Resolved at 2025-01-01T00:00:00Z"


def _write_run(path, steps=3):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps({"step": s, "data": {"timing_s/step": 10.0}}) + b"\n"
                              for s in range(1, steps + 1)))


def _ingested_labels(tmp_path, project: str, experiment: str) -> tuple[str, str]:
    """The labels the real file source gives a run written at <root>/<project>/<experiment>.jsonl."""
    root = tmp_path / "root"
    _write_run(root / project / f"{experiment}.jsonl")
    store = RunStore()
    FileSource(store, [str(root)], "jsonl").poll_once()
    assert len(store.runs) == 1 and next(iter(store.runs.values())).steps_total == 3
    return next(iter(store.runs))


def _note(project: str, experiment: str, status: str = "firing") -> dict:
    labels = {"alertname": "TrainingStalled", "severity": "critical", "project": project, "experiment": experiment}
    return {"version": "4", "groupKey": f'{{}}:{{project="{project}"}}', "status": status, "receiver": "omniwatch",
            "externalURL": "http://am.local", "commonLabels": labels,
            "alerts": [{"status": status, "startsAt": "2025-01-01T00:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
                        "labels": labels,
                        "annotations": {"summary": f"Run {project}/{experiment} made no step for 20 min.",
                                        "description": f"last step 41 of {experiment}", "step": "41"}}]}


def _all_renderings(body: dict) -> dict[str, str]:
    msg = build(body, "http://grafana.local")
    return {"text": text(msg), "slack": json.dumps(render_slack(msg)),
            "feishu_card": json.dumps(render_feishu(msg), ensure_ascii=False),
            "feishu_post": json.dumps(render_feishu(msg, "post"), ensure_ascii=False),
            "webhook_text": render_webhook(msg, body, "d1")["text"]}


def test_a_run_named_like_a_feishu_at_tag_mentions_no_one(tmp_path):
    project, experiment = _ingested_labels(tmp_path, "<at id=all><", "at>")
    assert f"{project}/{experiment}" == "<at id=all></at>"  # the attack: the run label is the tag
    out = _all_renderings(_note(project, experiment))
    for fmt in ("feishu_card", "feishu_post"):
        assert "<at" not in out[fmt] and "lark_md" not in out[fmt], (fmt, out[fmt])
        # the run is still named (defanged with an invisible character), not dropped
        assert "<\u200bat id=all><\u200b/at>" in out[fmt]
    card = json.loads(out["feishu_card"])["card"]
    tags = {e["text"]["tag"] for e in card["elements"] if e.get("tag") == "div"}
    assert tags == {"plain_text"} and card["header"]["title"]["tag"] == "plain_text"
    assert "&lt;at id=all&gt;" in out["slack"] and "<at" not in out["slack"]


def test_control_a_plain_run_name_renders_as_before(tmp_path):
    project, experiment = _ingested_labels(tmp_path, "flowgrpo", "exp7")
    out = _all_renderings(_note(project, experiment))
    lines = out["text"].split("\n")
    assert lines[0] == "TrainingStalled (critical) — run flowgrpo/exp7 · step 41"
    assert "Run flowgrpo/exp7 made no step for 20 min." in lines
    card = json.loads(out["feishu_card"])["card"]
    assert "TrainingStalled (critical) — run flowgrpo/exp7 · step 41" in card["elements"][0]["text"]["content"]


def test_a_newline_in_a_file_name_is_stripped_at_ingest(tmp_path):
    project, experiment = _ingested_labels(tmp_path, "p\x1b[31m", f"e\n{FAKE_LINE}\r\u202eevil")
    assert project == "p[31m" and experiment == f"e{FAKE_LINE}evil"
    assert not any(ord(c) < 32 or 0x7f <= ord(c) <= 0x9f or c == "\u202e" for c in project + experiment)


def test_a_newline_in_a_label_plants_no_line_on_any_receiver():
    """A label from elsewhere (a foreign rule, an older exporter) with a newline: every receiver shows one line
    per field, so no line of a firing alert reads "Resolved at"."""
    out = _all_renderings(_note("p", f"e\n{FAKE_LINE}\n"))
    for fmt, s in out.items():
        rendered = s if fmt in ("text", "webhook_text") else s.replace("\\n", "\n")
        planted = [ln for ln in rendered.split("\n") if ln.strip().strip('"[{').startswith("Resolved at")]
        assert not planted, (fmt, rendered)
    # control: a real resolved alert still gets its "Resolved at" line
    res = _note("p", "e", status="resolved")
    res["alerts"][0]["endsAt"] = "2025-01-01T01:00:00Z"
    assert any(ln.startswith("Resolved at") for ln in _all_renderings(res)["text"].split("\n"))


def test_the_hostile_run_through_the_relay_reaches_feishu_without_a_mention(relay_app, tmp_path):  # noqa: F811
    """End to end: the notification posted to the exporter's Alertmanager webhook, delivered by the relay to
    a real HTTP receiver of each type."""
    project, experiment = _ingested_labels(tmp_path, "<at id=all><", "at>")
    app, rcv, _store = relay_app
    body = _note(project, f"{experiment}\n{FAKE_LINE}")
    with TestClient(app) as c:
        r = c.post("/api/v1/alertmanager", json=body, headers={"Authorization": f"Bearer {HOOK}"})
        assert r.status_code == 200
        got = rcv.wait_accepted(3, timeout=20)
    by_path = {g["path"]: g["body"] for g in got}
    feishu = json.dumps(by_path["/feishu"], ensure_ascii=False)
    assert "TrainingStalled" in feishu and "<at" not in feishu and "lark_md" not in feishu
    for path, sent in by_path.items():
        msgs = [sent["text"]] if path == "/webhook" else [a["text"] for a in sent.get("attachments", [])] \
            if path == "/slack" else [e["text"]["content"] for e in sent["card"]["elements"] if e.get("tag") == "div"]
        for m in msgs:
            assert not any(ln.startswith("Resolved at") for ln in m.split("\n")), (path, m)
