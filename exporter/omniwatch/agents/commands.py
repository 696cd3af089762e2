"""``omniwatch agent`` (run one node agent here) and ``omniwatch agents start|status|stop`` (one per
Ray node, placed and kept by a supervisor actor)."""
from __future__ import annotations

import json
import signal
import sys
import threading

from .. import cliargs
from ..settings import parse_listen


def cmd_agent(args) -> int:
    from .node import NodeAgent
    host, port = parse_listen(args.listen)
    agent = NodeAgent(host, port, node=args.node, gpu="on" if args.gpu else args.gpu_mode,
                      exporter_url=args.exporter, heartbeat_s=args.heartbeat,
                      advertise_host=args.advertise_host).start()
    # One JSON line first: scripts and Ray read the bound port from it (the port is never fixed).
    print(json.dumps({"node": agent.node, "address": agent.address, "port": agent.port}), flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    try:
        done.wait()
    finally:
        agent.stop(deregister=True)
    return 0


def cmd_start(args) -> int:
    from . import placement
    try:
        st = placement.start(args.ray_address, args.exporter, heartbeat_s=args.heartbeat,
                             reconcile_s=args.reconcile, gpu="on" if args.gpu else args.gpu_mode,
                             namespace=args.namespace)
    except ConnectionError as e:
        print(f"error: cannot attach to Ray at {args.ray_address or 'auto'}: {e}", file=sys.stderr)
        return 2
    _print_status(st)
    return 0


def cmd_status(args) -> int:
    from . import placement
    st = placement.status(args.ray_address, args.namespace)
    if st is None:
        print("no omniwatch agents in this cluster (run `omniwatch agents start`)")
        return 1
    _print_status(st)
    return 0


def cmd_stop(args) -> int:
    from . import placement
    n = placement.stop(args.ray_address, args.namespace)
    print(f"stopped {n} agent(s)")
    return 0


def _print_status(st: dict) -> None:
    agents = st.get("agents", {})
    for nid, a in sorted(agents.items(), key=lambda kv: kv[1].get("node", "")):
        print(f"{a.get('node', '?'):<32} {a.get('address', a.get('error', '?')):<24} node_id={nid[:12]} "
              f"pid={a.get('pid', '?')} registered={a.get('registered', False)}")
    print(f"{len(agents)} agent(s); supervisor rounds={st.get('rounds')} placed={st.get('placed')}")


def _agent_flags(p, default_heartbeat: float) -> None:
    p.add_argument("--exporter", default=None, metavar="URL",
                   help="exporter to register with (http://host:port); the push token comes from "
                        "OMNIWATCH_PUSH_TOKEN or OMNIWATCH_PUSH_TOKEN_FILE")
    p.add_argument("--gpu", action="store_true", help="require the GPU sampler (report it down when NVML fails)")
    p.add_argument("--gpu-mode", default="auto", choices=["auto", "on", "off"], help=argparse_help_gpu)
    p.add_argument("--heartbeat", type=cliargs.positive_float, default=default_heartbeat, help="seconds between registrations")


argparse_help_gpu = "GPU sampler: auto (when NVML works here), on, off (default %(default)s)"


def add_commands(sub) -> None:
    p = sub.add_parser("agent", help="run a node agent here: node-local sources (GPU sampler) on a free port")
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (default %(default)s: a free port on loopback)")
    p.add_argument("--advertise-host", default=None, help="host Prometheus should scrape (default: the listen host)")
    p.add_argument("--node", default=None, help="node label (default: the host name)")
    _agent_flags(p, 10.0)
    p.set_defaults(func=cmd_agent)

    a = sub.add_parser("agents", help="place one node agent per Ray node (start), list (status), remove (stop)")
    asub = a.add_subparsers(dest="agents_command", metavar="ACTION")
    s = asub.add_parser("start", help="one agent per alive Ray node, kept by a supervisor actor (idempotent)")
    s.add_argument("--ray-address", default=None, help="Ray cluster (default: RAY_ADDRESS or the local cluster)")
    s.add_argument("--namespace", default="omniwatch")
    s.add_argument("--reconcile", type=cliargs.positive_float, default=30.0, help="seconds between placement rounds")
    _agent_flags(s, 10.0)
    s.set_defaults(func=cmd_start)
    for name, fn, hlp in (("status", cmd_status, "list the agents"), ("stop", cmd_stop, "deregister and remove every agent")):
        q = asub.add_parser(name, help=hlp)
        q.add_argument("--ray-address", default=None)
        q.add_argument("--namespace", default="omniwatch")
        q.set_defaults(func=fn)
