"""Who holds the step, end to end, run INSIDE a private network namespace (``unshare -n`` + ``ip link set
lo up``). Started by tests/test_raytasks_live.py:

    unshare -n sh -c 'ip link set lo up && exec python tests/raytasks_scenario.py OUT.json [RECORD_DIR]'

A real Ray 2.60 head (``ray start --head``, token authentication on: RAY_AUTH_MODE=token and
~/.ray/auth_token), the FlowGRPO-shaped loop on verl's real single controller (tests/raytasks_trainer.py),
the real omniwatch exporter app with the task-event source on (``--ray-tasks``), and a TaskPoller in this
process (its ledger is compared with what the workers say they did). Phases: normal steps (lanes, the
slow rank), a hang in rank 1's update_actor (``omniwatch ps --json`` and the holder series), a rollout
replica holding requests, a killed actor. Writes what it observed to OUT.json; with RECORD_DIR it also
saves the state API's raw answers there (the unit tests' fixtures). Every wait is bounded; everything
started is stopped.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import httpx

from omniwatch.proc import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
sys.path.insert(0, TESTS)
from discovery_scenario import stop_own_ray  # noqa: E402  (only this scenario's Ray processes)
PY = sys.executable
INTERVAL = 0.5
obs: dict = {"steps": []}
procs: list[subprocess.Popen] = []


def note(name: str) -> None:
    obs["steps"].append([round(time.monotonic() - T0, 1), name])
    print(f"[raytasks {time.monotonic() - T0:6.1f}s] {name}", flush=True)


def wait_for(what: str, fn, timeout: float, every: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = fn()
        except Exception:
            v = None
        if v:
            return v
        time.sleep(every)
    obs.setdefault("timeouts", []).append(what)
    return None


class Lines:
    """A child's stdout, one JSON object per line, read by a thread."""

    def __init__(self, p: subprocess.Popen):
        self.items: list[dict] = []
        self.raw: list[str] = []
        threading.Thread(target=self._read, args=(p,), daemon=True).start()

    def _read(self, p):
        for ln in p.stdout:
            self.raw.append(ln.rstrip()[:300])
            try:
                self.items.append(json.loads(ln))
            except ValueError:
                pass

    def find(self, key: str):
        return next((x for x in self.items if key in x), None)

    def count(self, key: str) -> int:
        return sum(1 for x in self.items if key in x)


def ps_json(dash: str, env: dict) -> dict:
    r = subprocess.run([PY, "-m", "omniwatch", "ps", "--json", "--ray-address", dash], capture_output=True,
                       text=True, timeout=60, env=env)
    obs.setdefault("ps_stderr", []).append(r.stderr[-500:])
    return json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}


def main(out_path: str, record_dir: str | None = None) -> int:
    work = tempfile.mkdtemp(prefix="owt-", dir="/tmp")
    ray_tmp = tempfile.mkdtemp(prefix="owrt", dir="/tmp")  # short: Ray puts unix sockets under it
    cmd_dir = os.path.join(work, "cmd")
    os.makedirs(cmd_dir)
    # Token authentication as Ray 2.60 has it by default, with the token at ~/.ray/auth_token -- under a HOME
    # of this scenario's own, so the host's ~/.ray (other tests' clusters) is never touched.
    home = os.path.join(work, "home")
    os.makedirs(os.path.join(home, ".ray"))
    import secrets
    token = secrets.token_hex(32)
    with open(os.path.join(home, ".ray", "auth_token"), "w") as f:
        f.write(token)
    # RAY_worker_niceness=0: the raylet starts workers at nice 15 by default (its worker_niceness config, read from
    # this variable); beside a loaded test suite's nice-0 processes they starve (CI: two 1-rank runs of 5-8 steps took 2 min)
    env = dict(os.environ, HOME=home, RAY_AUTH_MODE="token", RAY_TMPDIR=ray_tmp, RAY_USAGE_STATS_ENABLED="0",
               RAY_worker_niceness="0",
               PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    env.pop("RAY_ADDRESS", None)
    os.environ.update(RAY_AUTH_MODE="token", HOME=home)
    gcs_port, dash_port = free_port(), free_port()
    dash = f"http://127.0.0.1:{dash_port}"
    poller = None
    try:
        note("ray start --head")
        from ray_start import ray_start_lock
        with ray_start_lock():  # one Ray start at a time on this machine (tests/ray_start.py)
            r = subprocess.run(["ray", "start", "--head", f"--port={gcs_port}", f"--dashboard-port={dash_port}",
                                "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1", "--num-cpus=8",
                                f"--temp-dir={ray_tmp}", "--include-dashboard=true", "--disable-usage-stats"],
                               capture_output=True, text=True, timeout=180, env=env)
        obs["ray_start_rc"] = r.returncode
        obs["ray_start_log"] = (r.stdout + r.stderr)[-1500:]
        from omniwatch.discovery import taskevents as te
        from omniwatch.discovery.rayapi import StateAPI
        from omniwatch.discovery.taskwatch import TaskPoller
        api = StateAPI(dash, timeout=5)
        obs["state_api_up"] = bool(wait_for("state API answers", lambda: api.list("nodes").rows, 120, 1.0))
        unauth = httpx.get(f"{dash}/api/v0/tasks", params={"limit": "1"}, timeout=5, trust_env=False)
        obs["without_token_status"] = unauth.status_code

        note("exporter")
        exp_log = os.path.join(work, "exporter.log")
        ep = subprocess.Popen([PY, os.path.join(TESTS, "standins", "exporter_app.py"), "--log-file", exp_log,
                               "--ray-address", "off", "--ray-sd-file", "off", "--ray-tasks", dash,
                               "--ray-tasks-interval", str(INTERVAL), "--discovery-project", "proj",
                               "--discovery-experiment", "exp1", "--gpu-replay", "4"], stdout=subprocess.PIPE, text=True,
                              env=env)
        procs.append(ep)
        exp = f"http://127.0.0.1:{json.loads(ep.stdout.readline())['port']}"

        note("trainer (verl single controller)")
        truth_path = os.path.join(work, "truth.jsonl")
        tp = subprocess.Popen([PY, os.path.join(TESTS, "raytasks_trainer.py"), f"127.0.0.1:{gcs_port}", truth_path, cmd_dir],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        procs.append(tp)
        lines = Lines(tp)
        obs["trainer_ready"] = wait_for("trainer ready", lambda: lines.find("ready"), 240, 0.5)
        poller = TaskPoller(dash, interval=INTERVAL, timeout=5, page=2000)
        poll_times: list[list[float]] = []  # [start, end] of each poll that completed
        stop = threading.Event()

        def loop():
            while not stop.is_set():
                try:
                    with poller.lock:
                        t_poll = time.time()
                        poller.poll()
                    poll_times.append([t_poll, time.time()])
                except Exception as e:
                    obs.setdefault("poll_errors", []).append(str(e)[:200])
                stop.wait(INTERVAL)
        threading.Thread(target=loop, daemon=True).start()

        note("normal steps")
        wait_for("3 steps", lambda: lines.count("step") >= 3, 240, 0.5)

        def whole_dispatch_polled():
            # what test_lanes_match_the_workers_own_spans needs: one dispatch (not generate, step >= 2) whose 4 ranks
            # were each RUNNING in the GCS through a whole poll (Ray reports task events every 1 s), ended early
            # enough to be final. On a loaded 2-core machine a poll can wait tens of seconds for Ray: watch more steps
            polls = poll_times[:]
            if len(polls) < 2:
                return False
            slack = max(b[1] - a[1] for a, b in zip(polls, polls[1:])) + 1.1
            with open(truth_path) as f:
                spans = [json.loads(x) for x in f]
            ranks: dict = {}
            for sp in spans:
                if sp["phase"] != "generate" and sp["step"] >= 2 and sp["end"] <= polls[-1][1] - slack and any(
                        sp["start"] + 1.0 <= a and b <= sp["end"] for a, b in polls):
                    ranks.setdefault((sp["step"], sp["phase"]), set()).add(sp["rank"])
            return any(r == {0, 1, 2, 3} for r in ranks.values())
        if not wait_for("a whole dispatch polled", whole_dispatch_polled, 150, 1.0):
            obs["timeouts"].remove("a whole dispatch polled")   # the test says what it saw
        with poller.lock:
            led = poller.ledger
            obs["ledger_done"] = [{"role": t.call.role, "phase": t.call.phase, "rank": led.rank(t), "start": t.start,
                                   "end": t.end, "estimated": t.end_estimated, "final": t.final, "pid": t.pid,
                                   "replica": t.call.replica}
                                  for t in led.done]
            from omniwatch.discovery.taskmetrics import straggler_streaks
            obs["streaks"] = straggler_streaks(led)
            obs["dispatch_spreads"] = [[d.role, d.phase, d.spread()] for d in led.dispatches]
        obs["poll_times"] = poll_times[:]
        obs["poll_cost"] = [poller.snapshot.cost.calls, poller.snapshot.cost.wall_s, poller.snapshot.cost.cpu_s]
        with open(truth_path) as f:
            obs["truth"] = [json.loads(x) for x in f]
        obs["metrics_normal"] = httpx.get(f"{exp}/metrics", timeout=10, trust_env=False).text

        note("hang rank 1 in update_actor")
        open(os.path.join(cmd_dir, "hang"), "w").close()
        hang_step = wait_for("hang armed", lambda: lines.find("hanging_step"), 120, 0.2)
        # update_actor starts after infer_actor_batch returns; 3 ranks finish in UPDATE_S (+ the slow one)
        t_hang = time.time()

        def hung_named():
            snap = poller.snapshot
            g = [g for g in snap.groups if g["phase"] == "update_actor" and g["running"] == 1 and g["done"] == 3]
            return (snap, g[0]) if g else None
        seen = wait_for("poller names the hung rank", hung_named, 60, 0.1)
        named_at = time.time()
        obs["hang_named_after_s"] = round(named_at - t_hang, 2) if seen else None
        if seen:  # latency: from the true end of the last healthy rank (its start is Ray's, its sleep known)
            from raytasks_trainer import SLOW_EXTRA_S, SLOW_RANK, UPDATE_S
            with poller.lock:
                d = [d for d in poller.ledger.dispatches if d.phase == "update_actor"][-1]
                starts = {poller.ledger.rank(t): t.start for t in d.tasks}
            obs["hang_latency_s"] = round(named_at - (starts[SLOW_RANK] + UPDATE_S + SLOW_EXTRA_S), 2)
        # when did the other 3 ranks finish (the workers' own clock, from the truth file after the fact)?
        obs["hang_group"] = seen[1] if seen else None
        obs["hang_holder"] = seen[0].holder if seen else None
        obs["hang_step"] = hang_step
        obs["ps_hang"] = ps_json(dash, env)
        # the GCS address a Ray user knows (what `ray start` prints): ps finds the dashboard through it (issue 35 #15)
        obs["ps_gcs"] = ps_json(f"127.0.0.1:{gcs_port}", env)
        obs["ps_exporter"] = httpx.get(f"{exp}/api/v1/ps", timeout=10, trust_env=False).json()
        obs["metrics_hang"] = wait_for("holder series in /metrics", lambda: (lambda b: b if "omniwatch_step_holder_info{" in b and "update_actor" in b and "rank 1" in b else None)(
            httpx.get(f"{exp}/metrics", timeout=10, trust_env=False).text), 30, 0.5)
        if record_dir:
            os.makedirs(record_dir, exist_ok=True)
            for name, kind, filters in (("tasks_running_hang.json", "tasks", [("state", "=", "RUNNING")]),
                                        ("tasks_failed.json", "tasks", [("state", "=", "FAILED")]),
                                        ("actors.json", "actors", []), ("nodes.json", "nodes", []),
                                        ("tasks_finished_update_actor.json", "tasks",
                                         [("state", "=", "FINISHED"), ("name", "=", "WorkerDict.actor_rollout_update_actor")])):
                params = [("limit", "2000"), ("detail", "true" if kind == "tasks" else "false")]
                for k, p_, v in filters:
                    params += [("filter_keys", k), ("filter_predicates", p_), ("filter_values", v)]
                body = api._client.get(f"/api/v0/{kind}", params=params).json()
                with open(os.path.join(record_dir, name), "w") as f:
                    json.dump(body, f, indent=1, sort_keys=True)
            with open(os.path.join(record_dir, "recorded_at.json"), "w") as f:
                json.dump({"poll_time": time.time(), "ray": __import__("ray").__version__}, f)

        note("a rollout replica holds requests")
        open(os.path.join(cmd_dir, "hold"), "w").close()
        obs["replica_held"] = wait_for("replica holds 6", lambda: [r for r in poller.snapshot.replicas if r["in_flight"] >= 6], 60, 0.2)
        obs["ps_hold"] = ps_json(dash, env)

        note("kill rank 3")
        open(os.path.join(cmd_dir, "kill"), "w").close()
        obs["killed"] = wait_for("trainer killed", lambda: lines.find("killed"), 60, 0.2)
        obs["dead_seen"] = wait_for("dead actor in snapshot", lambda: list(poller.snapshot.dead), 60, 0.2)
        obs["ps_dead"] = ps_json(dash, env)
        obs["holder_dead"] = poller.snapshot.holder
        stop.set()
        with open(exp_log) as f:
            log = f.read()
        obs["exporter_log"] = log[-20000:]
        obs["token_in_logs"] = token in log or any(token in x for x in lines.raw) or token in json.dumps(obs)
        obs["trainer_out"] = lines.raw[-40:]
    except (Exception, Overrun):
        obs["error"] = traceback.format_exc()
    finally:
        open(os.path.join(cmd_dir, "stop"), "w").close()
        for p in procs:
            p.kill()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        stop_own_ray(ray_tmp)  # never `ray stop --force`: it would kill other tests' clusters on this host
        with open(out_path, "w") as f:
            json.dump(obs, f, indent=1, default=str)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return 0


DEADLINE_S = 840  # below the test's own timeout: an overrun still cleans up and writes what it saw


class Overrun(BaseException):
    """The scenario's deadline: a BaseException, so no ``except Exception`` on the way (wait_for's probe) swallows it."""


def _overrun(signum, frame):
    signal.alarm(0)
    raise Overrun(f"scenario overran {DEADLINE_S} s")


if __name__ == "__main__":
    T0 = time.monotonic()
    signal.signal(signal.SIGALRM, _overrun)
    signal.alarm(DEADLINE_S)
    sys.exit(main(*sys.argv[1:3]))
