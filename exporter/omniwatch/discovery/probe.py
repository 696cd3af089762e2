"""The Ray side of discovery, run as a child process (``python -m omniwatch.discovery.probe``).

Why a child: attaching to Ray makes a process a Ray driver, and a driver whose cluster goes away
blocks in Ray calls and is eventually killed by Ray's core worker (GCS reconnect timeout). The
exporter must outlive the run it watches, so it never imports Ray itself; it reads one JSON line
per round from this child and restarts it with backoff when it dies or stops answering.

Each round reports: alive nodes and their metrics-export ports, the TransferQueue controller's
metrics endpoint (named actor ``TransferQueueController`` in namespace ``transfer_queue``), the
storage units' endpoints where metrics are on, and verl's rollout / reward-model server actors
(``vllm_server_<replica>_<node_rank>``, ``vllm_server_reward_<replica>_<node_rank>``).
Every Ray call carries a timeout.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import threading
import time

from ..settings import env, set_env

TQ_CONTROLLER = ("TransferQueueController", "transfer_queue")
TQ_STORAGE_NAME = re.compile(r"^TransferQueueStorageUnit#(\d+)$")
# SimpleStorageUnit.storage_unit_id = f"TQ_STORAGE_UNIT_{uuid4().hex[:8]}" (0.1.11); anything else is not a label value we set.
STORAGE_UNIT_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
# verl RolloutReplica.launch_servers names its server actors this way (verl/workers/rollout/*/..._server.py);
# only node_rank 0 serves HTTP for the replica. A model-id suffix may follow. VeRL-Omni's replicas use the
# prefix `vllm_omni_` (vllm_omni_async_server.py `_get_server_name_prefix`, docs/verl-source.md R8).
SERVER_NAME = re.compile(r"^(?P<engine>vllm_omni|vllm|sglang)_server_(?P<reward>reward_)?(?P<replica>\d+)_(?P<node>\d+)(?:_.*)?$")


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _addr(host: str, port) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def probe_tq(ray, timeout: float) -> dict:
    name, ns = TQ_CONTROLLER
    try:
        ctl = ray.get_actor(name, namespace=ns)
    except ValueError:
        return {"state": "absent", "detail": f"no actor {name!r} in namespace {ns!r} (not a V1 trainer, or TQ not started yet)"}
    try:
        conf = ray.get(ctl.get_config.remote(), timeout=timeout)
    except Exception as e:  # GetTimeoutError, actor died, deserialization (omegaconf missing)
        return {"state": "error", "detail": f"{name}.get_config failed: {type(e).__name__}: {str(e)[:200]}"}
    if conf is None:
        return {"state": "starting", "detail": "controller has no config yet (tq.init still running)"}
    metrics = conf.get("metrics", {}) or {}
    endpoint = metrics.get("endpoint")
    if not metrics.get("enabled") or not endpoint:
        return {"state": "metrics_disabled",
                "detail": "TransferQueue metrics are off: set transfer_queue.metrics.enabled=true"}
    backend = None
    try:
        backend = conf.get("backend", {}).get("storage_backend")
    except Exception:
        pass
    return {"state": "ok", "endpoint": str(endpoint), "backend": backend}


def probe_storage(ray, named: list[dict], timeout: float) -> list[dict]:
    """Storage units' own /metrics. Only called when the controller's metrics are on: then
    tq.init has started every unit's exporter and ``start_metrics`` just returns its endpoint.

    Also the unit's ``storage_unit_id`` (``TQ_STORAGE_UNIT_<hex>``, the ``id`` of its
    ``get_zmq_server_info()``, transferqueue 0.1.11 ``SimpleStorageUnit``): the controller labels its
    copies of the unit's gauges with it, while the unit's own series carry no such label, so
    discovery sets it as a target label and both sides join on it. Missing (an older TQ, a failed
    call) leaves the target without it; the endpoint is still scraped."""
    out = []
    for a in named:
        m = TQ_STORAGE_NAME.match(a["name"])
        if not m:
            continue
        try:
            h = ray.get_actor(a["name"], namespace=a["namespace"])
            ep = ray.get(h.start_metrics.remote(port=0), timeout=timeout)
            item = {"unit": m.group(1), "endpoint": str(ep)}
        except Exception as e:
            out.append({"unit": m.group(1), "error": f"{type(e).__name__}: {str(e)[:120]}"})
            continue
        try:
            unit_id = getattr(ray.get(h.get_zmq_server_info.remote(), timeout=timeout), "id", None)
            if isinstance(unit_id, str) and STORAGE_UNIT_ID.match(unit_id):
                item["storage_unit_id"] = unit_id
        except Exception as e:  # the endpoint is still worth scraping
            item["id_error"] = f"{type(e).__name__}: {str(e)[:120]}"
        out.append(item)
    return out


def probe_servers(ray, named: list[dict], timeout: float) -> list[dict]:
    out = []
    for a in named:
        m = SERVER_NAME.match(a["name"])
        if not m or m["node"] != "0":
            continue
        item = {"name": a["name"], "role": "reward" if m["reward"] else "rollout", "replica": m["replica"]}
        try:
            h = ray.get_actor(a["name"], namespace=a["namespace"])
            host, port = ray.get(h.get_server_address.remote(), timeout=timeout)
            item["address"] = _addr(str(host), int(port))
        except Exception as e:
            item["error"] = f"{type(e).__name__}: {str(e)[:120]}"
        out.append(item)
    return out


def probe_nodes(ray) -> list[dict]:
    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        port = n.get("MetricsExportPort")
        ip = n.get("NodeManagerAddress")
        if ip and port:
            out.append({"address": _addr(str(ip), int(port)), "node_id": n.get("NodeID", "")[:12]})
    return out


def one_round(ray, timeout: float) -> dict:
    res: dict = {"ok": True, "ts": time.time()}
    try:
        res["nodes"] = probe_nodes(ray)
    except Exception as e:
        res["nodes"], res["nodes_error"] = [], f"{type(e).__name__}: {str(e)[:200]}"
    try:
        named = ray.util.list_named_actors(all_namespaces=True)
    except Exception as e:
        named, res["actors_error"] = [], f"{type(e).__name__}: {str(e)[:200]}"
    res["tq"] = probe_tq(ray, timeout)
    res["storage"] = probe_storage(ray, named, timeout) if res["tq"]["state"] == "ok" else []
    res["servers"] = probe_servers(ray, named, timeout)
    return res


def _temp_dir(ray) -> str | None:
    try:  # where this cluster writes its SD file (not always /tmp/ray)
        return ray._private.worker._global_node.get_temp_dir_path()
    except Exception:
        return None


def _token_available() -> bool:
    """Ray >= 2.5x clusters started by ray.init use token auth by default; a process that merely
    attaches only sends the token when RAY_AUTH_MODE=token. The token itself is never read here."""
    path = env("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    return bool(env("RAY_AUTH_TOKEN")) or os.path.isfile(path)


def _connect(ray, address: str):
    return ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR, configure_logging=False,
                    namespace="omniwatch")


def _exit_when_parent_goes(stdin) -> None:
    """The parent holds our stdin open; EOF means it is gone, so we go too."""
    try:
        while stdin.read(1024):
            pass
    finally:
        os._exit(0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="omniwatch Ray probe (child of the exporter)")
    p.add_argument("--address", default="auto")
    p.add_argument("--interval", type=float, default=10.0)
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--once", action="store_true")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if not a.once:
        threading.Thread(target=_exit_when_parent_goes, args=(sys.stdin,), daemon=True).start()
    if env("RAY_AUTH_MODE") is None and _token_available():
        set_env("RAY_AUTH_MODE", "token")  # read by Ray's core when it loads: set before the import
    try:
        import ray
    except ImportError:
        _emit({"ok": False, "error": "ray is not installed in this environment (pip install 'omniwatch[ray]')"})
        return 3
    try:
        ctx = _connect(ray, a.address)
    except Exception as e:
        cause = f" ({type(e.__cause__).__name__}: {str(e.__cause__).splitlines()[0][:200]})" if e.__cause__ and str(e.__cause__) else ""
        _emit({"ok": False, "error": f"no Ray cluster answered at {a.address!r}: {type(e).__name__}: {str(e).splitlines()[0][:200]}{cause}"})
        return 3
    hello = {"hello": True, "gcs": getattr(ctx, "address_info", {}).get("gcs_address"), "temp_dir": _temp_dir(ray),
             "ray_version": ray.__version__}
    _emit(hello)
    try:
        while True:
            _emit(one_round(ray, a.timeout))
            if a.once:
                return 0
            time.sleep(a.interval)
    finally:
        try:
            ray.shutdown()
        except Exception:
            pass


if __name__ == "__main__":
    sys.exit(main())
