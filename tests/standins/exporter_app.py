"""Run the real omniwatch exporter app (create_app + make_registry + the discovery router) under
uvicorn on 127.0.0.1, with the discovery flags of ``omniwatch.discovery.add_arguments``.
Prints ``{"port": N}`` once listening. A test launcher only: ``omniwatch serve`` is the product."""
from __future__ import annotations

import argparse
import json
import logging
import socket
import sys

import uvicorn

from omniwatch import discovery
from omniwatch.app import create_app
from omniwatch.core.exposition import make_registry
from omniwatch.core.model import RunStore
from omniwatch.settings import Settings


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--log-file", default=None)
    p.add_argument("--gpu-replay", type=int, default=0,
                   help="replay the recorded H200 trace as N GPUs of node 127.0.0.1 (per-fleet GPU time)")
    discovery.add_arguments(p)
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, filename=a.log_file, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    store = RunStore()
    settings = Settings.from_env(host="127.0.0.1", port=0)
    settings.extra["discovery"] = discovery.from_args(a)
    if a.gpu_replay:
        from omniwatch.gpu.loop import DEFAULT_TRACE, replay_backend
        settings.extra.update(gpu="on", gpu_backend=replay_backend(DEFAULT_TRACE, gpus=a.gpu_replay),
                              gpu_node="127.0.0.1")
    app = create_app(store, make_registry(store), settings)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(json.dumps({"port": sock.getsockname()[1]}), flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
