"""``omniwatch demo``: the native stack on fast intervals plus simulated FlowGRPO runs written in
exactly verl's JSONL format (``VERL_FILE_LOGGER_ROOT`` layout, ``"wb"``, one line per step), each run
injecting one fault after healthy steps. It prints every alert as it reaches the webhook and ends with
a table: injected fault -> alert -> steps to detect. The stack stays up for a look (``make down``)."""
from __future__ import annotations

import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
from rich.console import Console
from rich.table import Table

from .. import cliargs
from .. import names
from ..gpu.devices import nvml_available
from ..proc import free_port
from ..gpu.loop import DEFAULT_TRACE
from ..simulate import Fault, RunSpec, step_dict
from ..settings import Settings
from ..stack import DEMO_SUBDIR, Stack, StackConfig, StackError, add_stack_args, alerts_command

PROJECT = "omniwatch-demo"
REPLAY_NODE = "h200-replay"


@dataclass
class Scenario:
    experiment: str
    fault: str                    # text for the table
    expect: str | None            # alert name, None for the healthy control
    spec: RunSpec
    onset: int | None
    steps: int
    stop_after: int | None = None  # stall: the file simply stops after this step
    written: int = 0
    detected_step: int | None = None
    detected_at: float | None = None
    onset_time: float | None = None
    last_write: float | None = None
    remedy: str = ""              # the firing alert's remedy annotation (fits the run's detected layout)


def scenarios(pace: float, steps: int, onset: int) -> list[Scenario]:
    return [
        # The healthy run also logs rollout correction (decoupled) and ends as verl ends a run: a forced
        # checkpoint and validation on its last step, off the validation cadence, so omniwatch marks it finished.
        Scenario("healthy-control", "none (validation/7, checkpoint/8 steps, rollout correction; finishes)", None,
                 RunSpec(pace=pace, seed=1, validation_every=7, checkpoint_every=8, rollout_corr="decoupled",
                         total_steps=steps), None, steps),
        Scenario("reward-bound-colocated", "colocated RM 5x slower", names.ALERT_REWARD_BOUND,
                 RunSpec(pace=pace, seed=2, faults=[Fault("reward_slow", onset, factor=5.0)]), onset, steps),
        Scenario("reward-bound-async", "async reward tail 12x", names.ALERT_REWARD_BOUND,
                 RunSpec(trainer="legacy_async", pace=pace, seed=3, faults=[Fault("reward_slow", onset, factor=12.0)]),
                 onset, steps),
        Scenario("v1-transfer-idle", "V1 +36% untimed TQ transfer", names.ALERT_IDLE,
                 RunSpec(trainer="v1", pace=pace, seed=4, faults=[Fault("idle_gap", onset, seconds_share=0.36)]),
                 onset, steps),
        Scenario("mfu-above-one", "MFU reported 2.62", names.ALERT_MFU_IMPOSSIBLE,
                 RunSpec(pace=pace, seed=5, faults=[Fault("mfu_value", onset, value=2.62)]), onset, steps),
        Scenario("mfu-drop", "update_actor 2x, MFU /2", names.ALERT_MFU_DROP,
                 RunSpec(pace=pace, seed=6, faults=[Fault("actor_slow", onset, factor=2.0)]), onset, steps),
        Scenario("stalled", f"no step after step {onset}", names.ALERT_STALLED,
                 RunSpec(pace=pace, seed=7), onset, steps, stop_after=onset),
    ]


def write_run(sc: Scenario, root: Path, pace: float, stop: threading.Event) -> None:
    path = root / PROJECT / f"{sc.experiment}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb", buffering=0) as f:  # as verl's FileLogger: "wb", unbuffered
        for step in range(1, sc.steps + 1):
            if stop.is_set():
                return
            t0 = time.monotonic()
            f.write(orjson.dumps({"step": step, "data": step_dict(sc.spec, step)},
                                 option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
            sc.written, sc.last_write = step, time.time()
            if sc.onset == step:
                sc.onset_time = sc.last_write
            if sc.stop_after is not None and step >= sc.stop_after:
                return
            stop.wait(max(0.0, pace - (time.monotonic() - t0)))


def gpu_args() -> tuple[list[str], str]:
    """The exporter's GPU flags: the real GPUs when NVML works here, else the recorded H200 trace
    replayed as a live GPU (so the GPU and phase-idle panels have data); and a line saying which."""
    why = nvml_available()
    if why is None:
        return [], "GPU sampler: this machine's GPUs (NVML)"
    if not DEFAULT_TRACE.is_file():
        return [], f"GPU sampler off ({why}); no recorded trace to replay"
    return (["--gpu", f"replay:{DEFAULT_TRACE}", "--gpu-node", REPLAY_NODE],
            f"GPU sampler: no NVML here, replaying the recorded H200 trace {DEFAULT_TRACE.name} as node {REPLAY_NODE}")


def finish_runs(scs: list[Scenario], configs: Path) -> None:
    """The demo is over: each run's config says its last written step was its last (trainer.total_training_steps,
    read through --trainer-config), so the runs are finished and nothing escalates once the demo has ended."""
    for sc in scs:
        if sc.written:
            (configs / f"{sc.experiment}.config.yaml").write_text(   # named as a config: a DIR walk reads it
                f"trainer:\n  project_name: {PROJECT}\n  experiment_name: {sc.experiment}\n"
                f"  total_training_steps: {sc.written}\n")


RAY_STANDIN = "raystate"   # the Ray state API stand-in's component name (pid file, down, status)


def run_demo(args) -> int:
    # imported here, not at the top: ``python -m omniwatch.demo.standins`` (the process this starts) must not find
    # its own module already imported by the package
    from . import standins as demo_endpoints
    con = Console(width=None if sys.stdout.isatty() else 160)
    pace, steps, onset = args.step_seconds, args.steps, args.onset
    if onset >= steps:  # checked before the previous demo's data is wiped below
        print(f"omniwatch demo: error: --onset {onset} must be below --steps {steps} (a fault needs steps to show)",
              file=sys.stderr)
        return 2
    # Its own run dir (configs, TSDB, exporter state, logs): a later `omniwatch up` never sees its runs.
    run_dir = Path(args.run_dir) / DEMO_SUBDIR
    root = run_dir.resolve() / "demo-logs"
    gpu, gpu_line = gpu_args()
    cfg = StackConfig(run_dir=run_dir, prometheus_port=args.prometheus_port, alertmanager_port=args.alertmanager_port,
                      exporter_port=args.exporter_port, grafana_port=args.grafana_port, profile="fast",
                      watch=[str(root)], exporter_args=["--poll-interval", "0.2"] + gpu
                      + ["--trainer-config", str(run_dir.resolve() / "demo-configs")])
    ep_port = free_port(cfg.host)
    # Realistic vLLM-Omni / TransferQueue / GPU / Ray series for the dashboards (the demo cannot run a real
    # vLLM-Omni or GPU), with the real metric names, joined by target labels to two demo runs (each its own
    # endpoint set), so every run-scoped panel shows that it keeps runs apart.
    cfg.extra_scrape_configs = demo_endpoints.scrape_configs(cfg.host, ep_port, PROJECT, "reward-bound-colocated",
                                                             also=[(PROJECT, "v1-transfer-idle")])
    # Ray's state API stand-in (/api/v0/...): the worker-lanes source, its job = the joined run. Its own process
    # (raystate), stopped when the demo ends: its straggling rank does not outlive the demo (issue 35 item 16)
    ray_port = free_port(cfg.host)
    cfg.exporter_args += demo_endpoints.ray_tasks_args(cfg.host, ray_port, PROJECT, "reward-bound-colocated")
    # The relay forwards every notification to a local receiver (a generic JSON webhook), as it would to
    # Slack or Feishu; the URL is passed by environment, as the relay requires for every receiver URL.
    rcv_port = free_port(cfg.host)
    received = run_dir.resolve() / "demo-receiver.jsonl"
    relay_cfg = run_dir.resolve() / "config" / "receivers.yml"
    cfg.exporter_env = {"OMNIWATCH_RELAY_CONFIG": str(relay_cfg),
                        "OMNIWATCH_DEMO_RECEIVER_URL": f"http://{cfg.host}:{rcv_port}/hook"}
    stack = Stack(cfg)
    try:  # ports another process holds (the real stack, another demo): said before anything is stopped or wiped
        stack.check_ports()
    except StackError as e:
        print(f"omniwatch demo: {e}", file=sys.stderr)
        if Stack(StackConfig(run_dir=Path(args.run_dir))).running():
            print("omniwatch demo: the stack `omniwatch up` started holds them: `omniwatch down` first (it "
                  "keeps its data), or give the demo other ports", file=sys.stderr)
        return 1
    stack.down()
    # A demo starts clean: no TSDB, Alertmanager state, alert history or exporter checkpoint of an earlier one.
    for sub in ("data", "state"):
        shutil.rmtree(stack.p(sub), ignore_errors=True)
    relay_cfg.parent.mkdir(parents=True, exist_ok=True)
    relay_cfg.write_text("receivers:\n  - name: demo-receiver\n    type: webhook\n"
                         "    url_env: OMNIWATCH_DEMO_RECEIVER_URL\n    send_resolved: true\n"
                         "retry: {initial_seconds: 1, max_seconds: 5}\n")
    received.unlink(missing_ok=True)
    shutil.rmtree(run_dir.resolve() / "demo-configs", ignore_errors=True)
    (run_dir.resolve() / "demo-configs").mkdir(parents=True, exist_ok=True)
    if root.exists():
        for p in root.rglob("*.jsonl"):
            p.unlink()
    root.mkdir(parents=True, exist_ok=True)
    con.print(f"[bold]omniwatch demo[/]: starting the native stack in {stack.run_dir} (fast profile: 1 s scrape/eval)")
    try:
        stack.start("receiver", [sys.executable, "-m", "omniwatch.demo.receiver", "--port", str(rcv_port),
                                 "--out", str(received)], {})
        stack.start("endpoints", [sys.executable, "-m", "omniwatch.demo.standins", "--port", str(ep_port)], {})
        stack.start(RAY_STANDIN, [sys.executable, "-m", "omniwatch.demo.raytasks", "--port", str(ray_port)], {})
        started = stack.up()
    except StackError as e:
        con.print(f"[red]omniwatch demo: {e}[/]")
        return 1
    for name, url in started.items():
        con.print(f"  {name:<13} {url}")
    if "grafana" not in started:
        con.print(f"  {'dashboards':<13} {stack.dashboards_hint()}", soft_wrap=True)
    con.print(gpu_line)
    scs = scenarios(pace, steps, onset)
    con.print(f"Simulating {len(scs)} FlowGRPO runs in {root}/{PROJECT}/ at {pace:g} s/step; faults start at step {onset}.")
    stop = threading.Event()
    threads = [threading.Thread(target=write_run, args=(sc, root, pace, stop), daemon=True) for sc in scs]
    for t in threads:
        t.start()
    seen: set[tuple] = set()
    by_exp = {sc.experiment: sc for sc in scs}
    t_start = time.time()
    deadline = time.monotonic() + args.timeout
    client = httpx.Client(timeout=3.0)
    try:
        while time.monotonic() < deadline:
            try:
                alerts = client.get(f"{cfg.exporter_url}/api/v1/alerts", params={"limit": 1000}).json()
            except (httpx.HTTPError, ValueError):
                alerts = []
            for a in alerts if isinstance(alerts, list) else []:
                if (a.get("receivedAt") or 0) < t_start:
                    continue
                labels = a.get("labels", {})
                key = (labels.get("alertname"), labels.get("experiment"), a.get("status"), a.get("startsAt"))
                if key in seen:
                    continue
                seen.add(key)
                if labels.get("alertname") == "Watchdog":
                    continue
                sc = by_exp.get(labels.get("experiment", ""))
                step = sc.written if sc else "-"
                colour = "red" if a.get("status") == "firing" else "green"
                con.print(f"[{time.time() - t_start:6.1f}s] [{colour}]{a.get('status', '?').upper():8}[/] "
                          f"{labels.get('alertname', '?'):<22} {labels.get('project', '')}/{labels.get('experiment', '')}"
                          f"  at step {step}  {a.get('annotations', {}).get('summary', '')}")
                if sc and a.get("status") == "firing" and labels.get("alertname") == sc.expect and sc.detected_step is None:
                    sc.detected_step, sc.detected_at = sc.written, time.time()
                    sc.remedy = (a.get("annotations") or {}).get("remedy", "")
            if all(sc.detected_step is not None for sc in scs if sc.expect) and \
                    all(not t.is_alive() for t, sc in zip(threads, scs) if sc.expect is None):
                break
            time.sleep(0.5)
    finally:
        stop.set()
        stack.stop(RAY_STANDIN)  # the demo's Ray ends with it: no straggler streak after the demo
        client.close()
        for t in threads:
            t.join(timeout=pace + 2)
        finish_runs(scs, run_dir.resolve() / "demo-configs")
    table = Table(title="omniwatch demo: injected fault -> alert -> steps to detect")
    for col in ("run", "injected fault", "onset step", "expected alert", "detected at step", "steps to detect",
                "seconds to detect"):
        table.add_column(col)
    ok = True
    for sc in scs:
        others = sorted({lab for (lab, exp, st, _) in seen if exp == sc.experiment and st == "firing"} - {sc.expect})
        if sc.expect is None:
            good = not others
            table.add_row(sc.experiment, sc.fault, "-", "none", "-", "-", "-" if good else "unexpected: " + ", ".join(others))
        elif sc.detected_step is None:
            good = False
            table.add_row(sc.experiment, sc.fault, str(sc.onset), sc.expect, "[red]not detected[/]", "-", "-")
        else:
            good = True
            if sc.stop_after is not None:
                steps_txt = "n/a (no new step)"
                secs = sc.detected_at - (sc.last_write or sc.detected_at)
                secs_txt = f"{secs:.0f} s after last step ({secs / pace:.1f} steps)"
            else:
                steps_txt = str(sc.detected_step - sc.onset + 1)
                secs_txt = f"{sc.detected_at - (sc.onset_time or sc.detected_at):.0f}"
            table.add_row(sc.experiment, sc.fault, str(sc.onset), sc.expect, str(sc.detected_step), steps_txt, secs_txt)
        ok &= good
    con.print(table)
    _print_remedies(con, scs)
    _print_forwarded(con, received, scs)
    con.print(f"Demo step pace {pace:g} s: the rules' `for: 15s` spans ~{15 / pace:.0f} demo steps but less than one "
              "step of a real run (30 s - 15 min per step); the step-window (k=3 normal steps) is the same.")
    con.print(f"Prometheus {cfg.prometheus_url}  exporter {cfg.exporter_url}/metrics  alerts and deliveries: "
              f"{alerts_command(cfg)}")
    con.print("The stack stays up for a look: `make down` (or `omniwatch down`) stops it. The demo's runs are marked "
              "finished (their configs say the last written step was the last), so nothing escalates after it; its Ray "
              "state API stand-in stopped with it (the worker lanes end there).")
    _write_report(con, root, run_dir.resolve() / "reports")
    return 0 if ok else 1


REPORT_RUN = "reward-bound-colocated"


def _write_report(con: Console, root: Path, out_dir: Path) -> Path | None:
    """The shareable report (omniwatch report) of one faulty demo run; its path is printed."""
    src = root / PROJECT / f"{REPORT_RUN}.jsonl"
    try:
        from ..report.html import run_page
        from ..report.gather import facts_of_runs, load_runs
        from ..report.verdict import verdict
        f = facts_of_runs(load_runs([src]))[0]
        out_dir.mkdir(parents=True, exist_ok=True)
        dest = out_dir / f"{REPORT_RUN}.html"
        dest.write_text(run_page(f, verdict(f)), encoding="utf-8")
    except Exception as e:  # noqa: BLE001 - the demo's result stands without its report
        con.print(f"[yellow]report of {src} not written: {e}[/]")
        return None
    con.print(f"Report of the {REPORT_RUN} run (open it in any browser, offline): {dest}", soft_wrap=True)
    return dest


def _print_remedies(con: Console, scs: list[Scenario]) -> None:
    """The fix each alert gave, chosen for the layout omniwatch detected in that run (omniwatch_run_info)."""
    t = Table(title="remedy per run (picked for the layout detected from the run's keys)")
    for col in ("run", "layout", "remedy (first sentence)"):
        t.add_column(col)
    for sc in scs:
        if sc.expect is None:
            continue
        layout = f"{sc.spec.trainer}, reward {sc.spec.reward}, {sc.spec.async_mode}"
        first = sc.remedy.split(". ")[0].rstrip(".") + "." if sc.remedy else "-"
        t.add_row(sc.experiment, layout, first)
    con.print(t)


def _print_forwarded(con: Console, path: Path, scs: list[Scenario]) -> None:
    """What the relay delivered to the local receiver (the messages a Slack/Feishu channel would get)."""
    import json
    time.sleep(2.0)  # the relay delivers asynchronously; give the last notifications a moment
    try:
        msgs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        msgs = []
    t = Table(title=f"relay -> local receiver: {len(msgs)} messages forwarded (as to Slack / Feishu)")
    for col in ("alert", "run", "status", "step", "message (first line)"):
        t.add_column(col)
    shown = set()
    for m in msgs:
        b = m.get("body", {})
        for a in b.get("alerts", []):
            key = (a.get("alertname"), a.get("run"), a.get("status"))
            if key in shown or a.get("alertname") == "Watchdog":
                continue
            shown.add(key)
            t.add_row(str(a.get("alertname")), str(a.get("run")), str(a.get("status")), str(a.get("step") or "-"),
                      (a.get("summary") or "") + (f"  Fix: {a['remedy'][:70]}" if a.get("remedy") else ""))
    con.print(t)


def add_commands(sub) -> None:
    p = sub.add_parser("demo", help="native stack + simulated FlowGRPO runs that trip every core alert")
    add_stack_args(p)
    p.add_argument("--step-seconds", type=cliargs.positive_float, default=Settings().demo_step_seconds,
                   help="wall seconds per simulated step (default %(default)s)")
    p.add_argument("--steps", type=cliargs.int_range(3), default=24, help="steps per simulated run (default %(default)s)")
    p.add_argument("--onset", type=cliargs.positive_int, default=10, help="step at which each fault starts (default %(default)s)")
    p.add_argument("--timeout", type=cliargs.positive_float, default=240.0, help="give up after this many seconds (default %(default)s)")
    p.set_defaults(func=run_demo)
