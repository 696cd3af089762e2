"""A newcomer's walk-through of the README's "Beside a real run" (issue 27 proof), in a fresh venv: the
commands as the README writes them (found in its text, so a README change that breaks them fails here), on a
simulated VERL_FILE_LOGGER_ROOT holding an old killed run and a live one, with a typo first and then the fix,
and Slack to a local receiver. Each step's output is checked.

The first `make up` creates the venv as the README says (`make` creates it and installs the project): the
Makefile's own install recipe into a new venv (VENV=...), pip offline on wheels repacked from the project's
venv (tests/fresh_venv.py: pip still resolves pyproject + constraints.txt itself, and the new venv holds only
what pyproject declares). Every later command runs that venv's `omniwatch` (PATH without the project venv).
Ports and the run dir come from the OMNIWATCH_* variables the README names, so the commands stay as written."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
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


def _spans() -> list[str]:
    """The section's inline commands, a line break inside a span read as a space."""
    return re.findall(r"`([^`]+)`", re.sub(r"\n\s+", " ", _section()))


def _commands() -> dict[str, list[str]]:
    """The README's commands of the section, as argv lists (the first of each kind it writes)."""
    spans = _spans()

    def first(pred, what):
        found = [c for c in spans if pred(c)]
        assert found, f"README's 'Beside a real run' no longer writes {what}: {spans}"
        return shlex.split(found[0])
    cmds = {"up": first(lambda c: c.startswith("make up WATCH=") and "SLACK_URL" not in c, "`make up WATCH=...`"),
            "up_slack": first(lambda c: c.startswith("make up WATCH=") and "SLACK_URL=" in c,
                              "`make up WATCH=... SLACK_URL=...`"),
            "status": first(lambda c: c == "make status", "`make status`"),
            "omniwatch_status": first(lambda c: c == "omniwatch status", "`omniwatch status`"),
            "alerts": first(lambda c: c == "omniwatch alerts", "`omniwatch alerts`"),
            "down": first(lambda c: c == "make down", "`make down`")}
    assert f"WATCH={ROOT_IN_README}" in cmds["up"], cmds
    intro = (REPO / "README.md").read_text().split("## ", 1)[0]
    assert "`make` creates `.venv`, installs the" in intro, "README no longer says `make` makes the venv"
    return cmds


def test_beside_a_real_run_as_the_readme_says(tmp_path):
    require_binary("prometheus")
    require_binary("alertmanager", "prometheus-alertmanager")
    make = require_binary("make")
    if shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        pytest.skip("a Docker engine answers here: the README's `make up` runs docker-compose.yml instead")
    from .fresh_venv import offline_pip_env, wheelhouse
    from .relay_support import Receiver
    cmds = _commands()
    venv = tmp_path / "venv"
    t0 = time.monotonic()
    wh = tmp_path / "wheelhouse"
    wheelhouse(wh, Path(sys.prefix), REPO)
    t_wheels = time.monotonic() - t0

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
    writer = subprocess.Popen(["python3", str(tmp_path / "writer.py"), str(fixture_path("flowgrpo_reward_bound")),
                               str(live), "0.4"])
    slack = Receiver().start()
    # the newcomer's shell: no project venv on PATH, the new venv's bin once it exists; pip offline (fresh_venv)
    env = {**offline_pip_env(wh, Path(sys.prefix)), "OMNIWATCH_RUN_DIR": str(tmp_path / ".omniwatch"),
           "OMNIWATCH_PROMETHEUS_PORT": str(free_port()), "OMNIWATCH_ALERTMANAGER_PORT": str(free_port()),
           "OMNIWATCH_EXPORTER_PORT": str(free_port()), "OMNIWATCH_GRAFANA_PORT": str(free_port())}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    make_vars = [f"VENV={venv}", f"PIP_FLAGS=-q --no-index --find-links {wh} --no-compile"]

    def run(argv: list[str], **extra) -> subprocess.CompletedProcess:
        target = str(extra.pop("root", root))
        argv = [a.replace(ROOT_IN_README, target).replace("https://hooks.slack.com/services/...",
                                                          f"{slack.url}/services/T1/B1/secret") for a in argv]
        if argv[0] == "make":
            argv = [make, *argv[1:], *make_vars]
        else:
            argv = [str(venv / "bin" / argv[0]), *argv[1:]]
        return subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO, env={**env, **extra})

    try:
        # 1. the first `make up` makes the venv (the Makefile's install recipe), with a typo in the path:
        #    said loudly, watched for, and the stack is up
        t0 = time.monotonic()
        typo = run(cmds["up"], root=tmp_path / "verl-log")
        t_first_up = time.monotonic() - t0
        assert typo.returncode == 0, typo.stdout + typo.stderr
        assert (venv / ".installed").is_file() and f"python3 -m venv {venv}" in typo.stdout, typo.stdout
        assert re.search(r"pip install .*-c constraints.txt -e '\.\[dev\]'", typo.stdout), typo.stdout
        assert f"WARNING: --watch {tmp_path / 'verl-log'}" in typo.stderr and "does not exist" in typo.stderr
        assert "MISSING: does not exist yet (watched for)" in typo.stdout, typo.stdout
        assert "notify       nowhere but `omniwatch alerts`" in typo.stdout, typo.stdout
        # the stack runs from the new venv, which holds only what pyproject declares
        info = json.loads((tmp_path / ".omniwatch" / "pids" / "exporter.json").read_text())
        assert info["argv"][0].startswith(str(venv)), info["argv"]

        # 2. the fix, with Slack: the exporter restarts with the right path and the receiver
        fixed = run(cmds["up_slack"])
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
        assert "pip install" not in fixed.stdout, fixed.stdout  # the venv is made once
        assert "restarted with the new configuration: exporter)" in fixed.stdout, fixed.stdout
        assert not fixed.stderr.strip() or "WARNING" not in fixed.stderr, fixed.stderr
        assert "notify       slack (slack): ok" in fixed.stdout, fixed.stdout

        # 3. status: both runs found under the root
        def both():
            out = run(cmds["omniwatch_status"]).stdout
            return out if "2 run(s) with steps, 2 file(s)" in out else None
        wait_for(both, timeout=60, what="status listing both runs")
        st = run(cmds["status"]).stdout
        assert "2 run(s) with steps, 2 file(s)" in st, st
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
    print(f"fresh venv: wheelhouse {t_wheels:.1f} s, first `make up` (venv + install + up) {t_first_up:.1f} s")
