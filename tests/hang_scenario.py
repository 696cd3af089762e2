"""The hang, end to end (issue 31), run INSIDE a private network namespace (``unshare -n`` + ``ip link set lo up``).
Started by tests/test_hang_live.py:

    unshare -n sh -c 'ip link set lo up && exec python tests/hang_scenario.py OUT.json [RECORD_DIR]'

One real Ray 2.60 head (``ray start --head``, token authentication, ``RAY_DASHBOARD_ENABLE_PROFILING=1`` so its
``/task/traceback`` answers, py-spy on PATH), the real exporter (``omniwatch serve --watch <root> --ray-tasks``), a
real Prometheus evaluating the real rule files (1 s scrape and evaluation), and three runs of tests/hang_trainer.py
(verl's real single controller inside a TaskRunner.run call, verl's own Tracking file logger), one after the other,
with no trainer config: ``finish`` (ends cleanly), ``fail`` (rank 0's update_actor raises), ``hang`` (rank 1's
update_actor never returns; the other ranks' return once the exporter has seen all four running, as a poll must
see a call to count it). Writes what it saw to OUT.json, with each wait's seconds (``waits``); with RECORD_DIR also Ray's raw answers (a stack dump,
the job list, the failed TaskRunner row) for the unit tests' fixtures. Every wait is bounded; everything started is
stopped.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

import httpx
import yaml

from omniwatch.proc import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
sys.path.insert(0, TESTS)
from discovery_scenario import stop_own_ray  # noqa: E402  (only this scenario's Ray processes)
PY = sys.executable
INTERVAL = 0.5
FINISH_STEPS = 5   # 2 warm-up steps + 3 normal ones: the run has a typical step, so its info stage has a bound
obs: dict = {"steps": []}
procs: list[subprocess.Popen] = []
T0 = time.monotonic()


def note(name: str) -> None:
    obs["steps"].append([round(time.monotonic() - T0, 1), name])
    print(f"[hang {time.monotonic() - T0:6.1f}s] {name}", flush=True)


def wait_for(what: str, fn, timeout: float, every: float = 0.25):
    """Poll ``fn`` until it returns something true or ``timeout`` passes; every wait's own seconds go to
    obs["waits"] ([what, seconds, met]) so a failure says which step was slow and by how much."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        try:
            v = fn()
        except Exception:
            v = None
        if v:
            obs.setdefault("waits", []).append([what, round(time.monotonic() - t0, 2), True])
            return v
        time.sleep(every)
    obs.setdefault("waits", []).append([what, round(time.monotonic() - t0, 2), False])
    obs.setdefault("timeouts", []).append(what)
    return None


def info_for_s() -> float:
    """The ``for:`` of TrainingStalled's info stage, in seconds, from the rule files Prometheus loads."""
    from omniwatch import rules
    for path in rules.rule_files():
        for group in yaml.safe_load(open(path))["groups"]:
            for r in group["rules"]:
                if r.get("alert") == "TrainingStalled" and r.get("labels", {}).get("severity") == "info":
                    m = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", r.get("for", "0s"))
                    return 60.0 * int(m[1] or 0) + int(m[2] or 0)
    raise LookupError("TrainingStalled info rule not found")


def metric(text: str, name: str, **labels) -> list[tuple[dict, float]]:
    from prometheus_client.parser import text_string_to_metric_families
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                out.append((s.labels, s.value))
    return out


def main(out_path: str, record_dir: str | None = None) -> int:
    work = tempfile.mkdtemp(prefix="owh-", dir="/tmp")
    ray_tmp = tempfile.mkdtemp(prefix="owhr", dir="/tmp")
    home = os.path.join(work, "home")
    os.makedirs(os.path.join(home, ".ray"))
    token = secrets.token_hex(32)
    with open(os.path.join(home, ".ray", "auth_token"), "w") as f:
        f.write(token)
    logroot = os.path.join(work, "logs")
    os.makedirs(logroot)
    bindir = os.path.dirname(PY)
    # RAY_worker_niceness=0: the raylet starts workers at nice 15 by default (its worker_niceness config, read from
    # this variable); beside a loaded test suite's nice-0 processes they starve (CI: two 1-rank runs of 5-8 steps took 2 min)
    env = dict(os.environ, HOME=home, RAY_AUTH_MODE="token", RAY_TMPDIR=ray_tmp, RAY_USAGE_STATS_ENABLED="0",
               RAY_worker_niceness="0",
               RAY_DASHBOARD_ENABLE_PROFILING="1", VERL_FILE_LOGGER_ROOT=logroot,
               PATH=os.pathsep.join([bindir, os.environ.get("PATH", "")]),
               PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    env.pop("RAY_ADDRESS", None)
    obs["py_spy"] = shutil.which("py-spy", path=env["PATH"])
    gcs_port, dash_port, exp_port, prom_port = free_port(), free_port(), free_port(), free_port()
    dash, exp, prom = (f"http://127.0.0.1:{p}" for p in (dash_port, exp_port, prom_port))
    try:
        note("ray start --head")
        from ray_start import ray_start_lock
        with ray_start_lock():
            r = subprocess.run(["ray", "start", "--head", f"--port={gcs_port}", f"--dashboard-port={dash_port}",
                                "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1", "--num-cpus=8",
                                f"--temp-dir={ray_tmp}", "--include-dashboard=true", "--disable-usage-stats"],
                               capture_output=True, text=True, timeout=180, env=env)
        obs["ray_start_rc"] = r.returncode
        obs["ray_start_log"] = (r.stdout + r.stderr)[-1500:]
        hdr = {"Authorization": f"Bearer {token}"}
        obs["state_api_up"] = bool(wait_for("state API", lambda: httpx.get(f"{dash}/api/v0/nodes", headers=hdr,
                                                                            timeout=5).status_code == 200, 120, 1.0))

        note("exporter + prometheus")
        state = os.path.join(work, "state")
        ep = subprocess.Popen([PY, "-m", "omniwatch", "serve", "--listen", f"127.0.0.1:{exp_port}", "--watch", logroot,
                               "--state-dir", state, "--poll-interval", "0.2", "--ray-address", "off",
                               "--ray-sd-file", "off", "--ray-tasks", dash, "--ray-tasks-interval", str(INTERVAL),
                               "--discovery-project", "proj", "--discovery-experiment", "hang"],
                              stdout=open(os.path.join(work, "exporter.log"), "wb"), stderr=subprocess.STDOUT, env=env)
        procs.append(ep)
        from omniwatch import rules
        with open(os.path.join(work, "prom.yml"), "w") as f:
            yaml.safe_dump({"global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
                            "rule_files": [str(p) for p in rules.rule_files()],
                            "scrape_configs": [{"job_name": "omniwatch",
                                                "static_configs": [{"targets": [f"127.0.0.1:{exp_port}"]}]}]}, f)
        pp = subprocess.Popen([shutil.which("prometheus"), f"--config.file={work}/prom.yml",
                               f"--storage.tsdb.path={work}/tsdb", f"--web.listen-address=127.0.0.1:{prom_port}"],
                              stdout=open(os.path.join(work, "prom.log"), "wb"), stderr=subprocess.STDOUT)
        procs.append(pp)
        wait_for("exporter up", lambda: httpx.get(f"{exp}/healthz", timeout=2).status_code == 200, 60, 0.3)
        wait_for("prometheus up", lambda: httpx.get(f"{prom}/-/ready", timeout=2).status_code == 200, 60, 0.3)

        def alerts(exp_name: str) -> list[dict]:
            return [a for a in httpx.get(f"{prom}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
                    if a["labels"].get("experiment") == exp_name]

        release = os.path.join(work, "release")   # the hung step's other ranks return once it exists (hang_trainer.py)

        def trainer(mode: str, name: str, steps: int, ranks: int) -> subprocess.Popen:
            p = subprocess.Popen([PY, os.path.join(TESTS, "hang_driver.py"), f"127.0.0.1:{gcs_port}", mode, "proj",
                                  name, str(steps), str(ranks)],
                                 stdout=open(os.path.join(work, f"trainer-{name}.log"), "wb"),
                                 stderr=subprocess.STDOUT, env=dict(env, OMNIWATCH_HANG_RELEASE=release))
            procs.append(p)
            return p

        def steps_of(name: str) -> int:
            try:
                with open(os.path.join(logroot, "proj", f"{name}.jsonl")) as f:
                    return sum(1 for _ in f)
            except OSError:
                return 0

        def connected(name: str) -> bool:
            with open(os.path.join(work, f"trainer-{name}.log"), errors="replace") as f:
                return "driver " in f.read()

        # Three jobs side by side (their workers' start-up overlaps): a clean finish and a failure on 1 rank, then
        # the hang on 4, started last so that it is the newest job (the one the task-event source watches)
        note("runs finish + fail, then hang")
        pf, px = trainer("finish", "finish", FINISH_STEPS, 1), trainer("fail", "fail", 5, 1)
        wait_for("finish and fail connected", lambda: connected("finish") and connected("fail"), 300, 0.3)
        ph = trainer("hang", "hang", 5, 4)

        # 1. a clean finish, no config: finished from Ray's job, never pages
        obs["finish_rc"] = pf.wait(5) if wait_for("finish exits", lambda: pf.poll() is not None, 300, 0.3) else None
        obs["finish_end"] = time.time()
        obs["finish_steps"] = steps_of("finish")
        obs["finish_finished"] = wait_for("finish run finished", lambda: metric(
            httpx.get(f"{exp}/metrics", timeout=5).text, "omniwatch_run_finished", experiment="finish")[0][1] == 1, 60, 0.3)
        obs["finish_finished_after_s"] = round(time.time() - obs["finish_end"], 1)
        obs["finish_job"] = [lab for lab, _ in metric(httpx.get(f"{exp}/metrics", timeout=5).text,
                                                       "omniwatch_ray_job_info", experiment="finish")]

        # 2. a failure: the job fails with Ray's error, TrainingCrashed pages
        obs["fail_rc"] = px.wait(5) if wait_for("fail exits", lambda: px.poll() is not None, 300, 0.3) else None
        obs["fail_end"] = time.time()
        crash = wait_for("TrainingCrashed fires", lambda: [a for a in alerts("fail") if a["labels"]["alertname"] ==
                                                           "TrainingCrashed" and a["state"] == "firing"], 120, 0.3)
        obs["fail_alert"] = crash[0] if crash else None
        obs["fail_alert_after_s"] = round(time.time() - obs["fail_end"], 1)
        obs["fail_stalled"] = [a for a in alerts("fail") if a["labels"]["alertname"] == "TrainingStalled"]
        if record_dir:
            os.makedirs(record_dir, exist_ok=True)
            jobs = httpx.get(f"{dash}/api/jobs/", headers=hdr, timeout=10).json()
            with open(os.path.join(record_dir, "jobs.json"), "w") as f:
                json.dump(jobs, f, indent=1, sort_keys=True)
            params = [("limit", "200"), ("detail", "true"), ("filter_keys", "state"), ("filter_predicates", "="),
                      ("filter_values", "FAILED")]
            with open(os.path.join(record_dir, "tasks_failed_job.json"), "w") as f:
                json.dump(httpx.get(f"{dash}/api/v0/tasks", params=params, headers=hdr, timeout=10).json(), f,
                          indent=1, sort_keys=True)

        # 3. a hang in rank 1's update_actor: the holder, its stack in ps and in TrainingStalled's warning. The other
        # three ranks return once the exporter has seen all four running: a call shorter than its gap between polls
        # is in no poll's answer, and a loaded machine stretches that gap (taskwatch.py: a slow poll waits longer)
        note("hang")
        wait_for("hang run steps", lambda: steps_of("hang") >= 4, 240, 0.5)
        obs["hang_last_step_t"] = os.stat(os.path.join(logroot, "proj", "hang.jsonl")).st_mtime

        def ps():
            return httpx.get(f"{exp}/api/v1/ps", timeout=5).json()

        holders: list = []   # [s since the release, holder text, the exporter's polls, that poll's wall s]: each change

        def holder(pred):
            a = ps()
            j = a["jobs"][0]
            if not holders or holders[-1][1] != j["holder"]:
                holders.append([round(time.time() - obs.get("hang_released_t", time.time()), 2), j["holder"],
                                a["poll"]["polls"], a["poll"]["wall_s"]])
            return (j, a["poll"]["polls"]) if pred(j) else None

        # the hung step's dispatch (it started after step 4's line), all four ranks in one poll's answer
        got = wait_for("4 ranks seen running", lambda: holder(lambda j: any(
            g["method"] == "update_actor" and g["running"] == 4 and g["since"] > obs["hang_last_step_t"]
            for g in j["groups"])), 240, 0.1)
        obs["hang_all_running_polls"] = got[1] if got else None
        open(release, "w").close()
        obs["hang_released_t"] = time.time()
        got = wait_for("holder named", lambda: holder(lambda j: re.match(r"update_actor: 3/4 ranks done", j["holder"])
                                                      and "rank 1" in j["holder"]), 120, 0.1)
        obs["hang_named_t"] = time.time()
        obs["ps_named"], obs["hang_named_polls"] = got if got else (None, None)
        obs["hang_holders"] = holders
        got = wait_for("stack in ps", lambda: holder(lambda j: (j.get("stack") or {}).get("ok")), 60, 0.1)
        obs["hang_stack_t"] = time.time()
        obs["ps_stack"], obs["hang_stack_polls"] = ({"jobs": [got[0]]}, got[1]) if got else (None, None)
        r = subprocess.run([PY, "-m", "omniwatch", "ps", "--exporter", exp], capture_output=True, text=True, timeout=60,
                           env=env)
        obs["ps_text"] = r.stdout[-3000:]
        r = subprocess.run([PY, "-m", "omniwatch", "ps", "--json", "--ray-address", dash], capture_output=True,
                           text=True, timeout=120, env=env)
        obs["ps_direct"] = json.loads(r.stdout) if r.stdout.strip().startswith("{") else {"stderr": r.stderr[-2000:]}
        warn = wait_for("TrainingStalled warning", lambda: [a for a in alerts("hang") if a["labels"]["alertname"] ==
                                                            "TrainingStalled" and a["labels"]["severity"] == "warning"
                                                            and a["state"] == "firing"], 180, 0.5)
        obs["hang_warning"] = warn[0] if warn else None
        obs["hang_warning_t"] = time.time()
        obs["stacks_page"] = httpx.get(f"{exp}/stacks", timeout=5).text[-6000:]
        obs["metrics_hang"] = "\n".join(x for x in httpx.get(f"{exp}/metrics", timeout=5).text.splitlines()
                                        if "stack_info" in x or "ray_job_info" in x or "run_crashed" in x
                                        or "run_finished" in x)
        if record_dir and obs["ps_stack"]:
            with open(os.path.join(record_dir, "stacks.json"), "w") as f:
                json.dump(httpx.get(f"{exp}/api/v1/stacks", timeout=5).json(), f, indent=1, sort_keys=True)

        # the clean finish never paged: had it not been known finished, its info stage would have fired by its
        # recorded info threshold (3 typical steps) + the rule's for: after its last step (<= the driver's exit),
        # + 2 evaluations and a scrape (1 s each)
        q = 'max_over_time(project_experiment:omniwatch_stall_threshold_seconds:info{experiment="finish"}[30m])'
        th = httpx.get(f"{prom}/api/v1/query", params={"query": q}, timeout=5).json()["data"]["result"]
        obs["finish_info_threshold_s"] = float(th[0]["value"][1]) if th else None
        obs["finish_info_bound_s"] = round((obs["finish_info_threshold_s"] or 60.0) + info_for_s() + 3.0, 1)
        wait_for("the finish's info stage due", lambda: time.time() - obs["finish_end"] > obs["finish_info_bound_s"],
                 obs["finish_info_bound_s"] + 10, 0.5)
        q = 'max_over_time(ALERTS{experiment="finish",alertname="TrainingStalled",alertstate="firing"}[30m])'
        obs["finish_alerts_ever"] = httpx.get(f"{prom}/api/v1/query", params={"query": q}, timeout=5).json()["data"]["result"]
        obs["finish_age_at_check_s"] = round(time.time() - obs["finish_end"], 1)
        with open(os.path.join(work, "exporter.log"), errors="replace") as f:
            log = f.read()
        obs["exporter_log"] = log[-15000:]
        obs["token_in_logs"] = token in log or token in json.dumps(obs)
    except (Exception, Overrun):
        obs["error"] = traceback.format_exc()
    finally:
        for name in ("finish", "fail", "hang"):
            try:
                with open(os.path.join(work, f"trainer-{name}.log"), errors="replace") as f:
                    obs[f"trainer_{name}_log"] = f.read()[-3000:]
            except OSError:
                pass
        for p in procs:
            p.kill()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        stop_own_ray(ray_tmp)
        with open(out_path, "w") as f:
            json.dump(obs, f, indent=1, default=str)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return 0


DEADLINE_S = 900


class Overrun(BaseException):
    """The scenario's deadline: a BaseException, so no ``except Exception`` on the way (wait_for's probe) swallows it."""


def _overrun(signum, frame):
    signal.alarm(0)
    raise Overrun(f"scenario overran {DEADLINE_S} s")


if __name__ == "__main__":
    signal.signal(signal.SIGALRM, _overrun)
    signal.alarm(DEADLINE_S)
    sys.exit(main(*sys.argv[1:3]))
