"""A newcomer's walk-through of the README's "Beside a real run" (issue 27 proof): the commands as the README
writes them (found in its text, so a README change that breaks them fails here), on a simulated
VERL_FILE_LOGGER_ROOT holding an old killed run and a live one, with a typo first and then the fix, and
Slack to a local receiver. Each step's output is checked. Ports and the run dir come from the
OMNIWATCH_* variables the README names, so the commands stay as written."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import REPO, fixture_path, free_port, require_binary, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT_IN_README = "/shared/verl-logs"

WRITER = """
import sys, time
src, dst, pace = sys.argv[1], sys.argv[2], float(sys.argv[3])
with open(dst, "a", buffering=1) as out:          # held open, as verl's FileLogger holds its file
    for line in open(src):
        out.write(line)
        time.sleep(pace)
    time.sleep(600)
"""


def _section() -> str:
    text = (REPO / "README.md").read_text()
    return text[text.index("## Beside a real run"):text.index("\n## ", text.index("## Beside a real run") + 5)]


def _commands() -> dict[str, list[str]]:
    """The README's commands of the section, as argv lists."""
    sec = _section()
    up = f"omniwatch up --watch {ROOT_IN_README}"
    assert f"`{up}`" in sec, sec
    assert "`OMNIWATCH_SLACK_URL=... omniwatch up ...`" in sec.replace("\n  ", " ").replace("   ", " "), sec
    for cmd in ("omniwatch status", "omniwatch alerts"):
        assert f"`{cmd}`" in sec, (cmd, sec)
    assert "`make down`" in sec
    return {"up": up.split(), "status": ["omniwatch", "status"], "alerts": ["omniwatch", "alerts"],
            "down": ["omniwatch", "down"]}


def test_beside_a_real_run_as_the_readme_says(tmp_path):
    require_binary("prometheus")
    require_binary("alertmanager", "prometheus-alertmanager")
    from .relay_support import Receiver
    cmds = _commands()
    root = tmp_path / "verl-logs"
    (root / "flowgrpo").mkdir(parents=True)
    # the old run: killed two weeks ago at step 10 (nobody holds its file)
    old = root / "flowgrpo" / "killed-last-week.jsonl"
    old.write_text("".join(fixture_path("flowgrpo_healthy").read_text().splitlines(keepends=True)[:10]))
    past = time.time() - 14 * 86400
    os.utime(old, (past, past))
    # the live run: a writer appends a step every 0.4 s; the reward model gets 5x slower at step 12
    live = root / "flowgrpo" / "live.jsonl"
    (tmp_path / "writer.py").write_text(WRITER)
    writer = subprocess.Popen([sys.executable, str(tmp_path / "writer.py"), str(fixture_path("flowgrpo_reward_bound")),
                               str(live), "0.4"])
    slack = Receiver().start()
    env = {**os.environ, "OMNIWATCH_RUN_DIR": str(tmp_path / ".omniwatch"),
           "OMNIWATCH_PROMETHEUS_PORT": str(free_port()), "OMNIWATCH_ALERTMANAGER_PORT": str(free_port()),
           "OMNIWATCH_EXPORTER_PORT": str(free_port()), "OMNIWATCH_GRAFANA_PORT": str(free_port())}

    def run(argv: list[str], **extra) -> subprocess.CompletedProcess:
        target = str(extra.pop("root", root))
        argv = [a.replace(ROOT_IN_README, target) for a in argv]
        return subprocess.run([sys.executable, "-m", "omniwatch", *argv[1:]], capture_output=True, text=True,
                              timeout=180, env={**env, **extra})

    try:
        # 1. a typo in the path: said loudly, watched for, and the stack is up
        typo = run(cmds["up"], root=tmp_path / "verl-log")
        assert typo.returncode == 0, typo.stdout + typo.stderr
        assert f"WARNING: --watch {tmp_path / 'verl-log'}" in typo.stderr and "does not exist" in typo.stderr
        assert "MISSING: does not exist yet (watched for)" in typo.stdout, typo.stdout
        assert "notify       nowhere but `omniwatch alerts`" in typo.stdout, typo.stdout

        # 2. the fix, with Slack: the exporter restarts with the right path and the receiver
        fixed = run(cmds["up"], OMNIWATCH_SLACK_URL=f"{slack.url}/services/T1/B1/secret")
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
        assert "restarted with the new configuration: exporter)" in fixed.stdout, fixed.stdout
        assert not fixed.stderr.strip() or "WARNING" not in fixed.stderr, fixed.stderr
        assert "notify       slack (slack): ok" in fixed.stdout, fixed.stdout

        # 3. status: both runs found under the root
        def both():
            out = run(cmds["status"]).stdout
            return out if "2 run(s) with steps, 2 file(s)" in out else None
        st = wait_for(both, timeout=60, what="status listing both runs")
        assert str(root) in st.split() and "slack (slack): ok" in st, st

        # 4. the live run's reward-bound alert reaches Slack; the old killed run pages nobody
        def live_alert():
            return [m for m in slack.accepted if "RewardBoundRollout" in json.dumps(m["body"])
                    and "flowgrpo/live" in json.dumps(m["body"])]
        wait_for(live_alert, timeout=120, what="RewardBoundRollout for flowgrpo/live at the Slack receiver")
        assert not [m for m in slack.accepted if "killed-last-week" in json.dumps(m["body"])]
        # the Watchdog heartbeat (every minute) stays out of the channel, in the alert history
        assert not [m for m in slack.accepted if "Watchdog" in json.dumps(m["body"])], slack.accepted

        # 5. omniwatch alerts lists it and the delivery
        al = run(cmds["alerts"], COLUMNS="200")  # a wide terminal: rich folds no cell
        assert al.returncode == 0, al.stderr
        assert "RewardBoundRollout" in al.stdout and re.search(r"slack\s+.\s+slack", al.stdout), al.stdout
    finally:
        down = run(cmds["down"])
        writer.kill()
        writer.wait()
        slack.stop()
    assert down.returncode == 0 and "stopped: " in down.stdout and "exporter" in down.stdout, down.stdout
