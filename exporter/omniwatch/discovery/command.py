"""``omniwatch discover``: one discovery pass, each target fetched once, and a plain answer to
"why is this source missing" — with the exact verl-omni override that turns it on."""
from __future__ import annotations

import json
import sys
import time

import httpx

from .. import cliargs
from .config import add_arguments, from_args
from .service import Discovery

PROBE_BYTES = 4 << 20
HINTS = {
    "tq": "TransferQueue metrics: transfer_queue.metrics.enabled=true (optionally transfer_queue.metrics.port=<port>); V1 trainers only",
    "rollout": "vLLM-Omni stats: actor_rollout_ref.rollout.disable_log_stats=False and actor_rollout_ref.rollout.prometheus.enable=True "
               "(or pass --rollout host:port)",
    "reward": "reward-model servers: reward.reward_model.rollout.disable_log_stats=False (found through Ray actors, or pass --reward host:port)",
    "ray": "Ray metrics: attach with --ray-address; fix the port with `ray start --metrics-export-port=<port>`",
}
FAMILIES = {"tq": ("tq_",), "rollout": ("vllm_omni:", "vllm:"), "reward": ("vllm:",), "ray": ("ray_",)}


def check_target(kind: str, address: str, timeout: float = 2.0) -> tuple[str, str]:
    """(state, detail): fetch /metrics once, bounded in time and bytes, and look for the families."""
    try:
        with httpx.Client(timeout=timeout, trust_env=False) as c, c.stream("GET", f"http://{address}/metrics") as r:
            if r.status_code != 200:
                return "error", f"HTTP {r.status_code}"
            body = b""
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > PROBE_BYTES:
                    break
    except httpx.HTTPError as e:
        return "unreachable", f"{type(e).__name__}: {str(e)[:100]}"
    text = body.decode("utf-8", "replace")
    names = {ln.split("{", 1)[0].split(" ", 1)[0] for ln in text.splitlines() if ln and not ln.startswith("#")}
    hits = [nm for nm in names if nm.startswith(FAMILIES[kind])]
    if hits:
        return "ok", f"{len(hits)} series names, e.g. {sorted(hits)[0]}"
    if kind in ("rollout", "reward"):
        return "no_stats", ("no vllm series: stats are off — " + HINTS[kind])
    return "no_series", f"no {FAMILIES[kind][0]}* series"


def run_discover(args) -> int:
    cfg = from_args(args)
    cfg.connect_timeout = args.timeout
    disc = Discovery(cfg)
    deadline = time.monotonic() + args.timeout + 2
    try:
        snap = disc.round()
        while disc.probe and snap.status.get("ray", {}).get("up") is None and time.monotonic() < deadline:
            time.sleep(0.5)
            snap = disc.round()
    finally:
        disc.stop()
    rows = []
    for t in snap.targets:
        state, detail = check_target(t.kind, t.address) if not args.no_fetch else ("-", "")
        rows.append({"kind": t.kind, "address": t.address, "origin": t.origin, "role": t.role,
                     "replica": t.replica, "state": state, "detail": detail})
    missing = {k: HINTS[k] for k, cnt in snap.counts().items() if cnt == 0}
    out = {"status": snap.status, "targets": rows, "missing": missing}
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    con = Console()
    st = Table(title="sources")
    for col in ("source", "state", "why"):
        st.add_column(col)
    for src, s in snap.status.items():
        st.add_row(src, {True: "up", False: "down", None: "-"}[s["up"]], escape(s["why"]))
    con.print(st)
    tt = Table(title="targets (served at /api/v1/sd)")
    for col in ("kind", "address", "origin", "role", "replica", "/metrics", "detail"):
        tt.add_column(col, no_wrap=col in ("address", "/metrics"))
    for r in rows:
        tt.add_row(*(escape(str(r[k])) for k in ("kind", "address", "origin", "role", "replica", "state", "detail")))
    con.print(tt)
    for kind, hint in missing.items():
        con.print(f"[yellow]no {kind} targets[/yellow]: {escape(hint)}")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("discover", help="find the run's TransferQueue, rollout, reward and Ray metrics endpoints")
    add_arguments(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--timeout", type=cliargs.positive_float, default=30.0, help="seconds to wait for Ray to answer")
    p.add_argument("--no-fetch", action="store_true", help="do not fetch each target's /metrics")
    p.set_defaults(func=run_discover)
