#!/usr/bin/env bash
# Install what the Ray / TransferQueue discovery tests need into a virtualenv, idempotently.
#   .ci/install-ray-tq.sh /path/to/venv
# torch goes first and pinned to the CPU build: transferqueue depends on torch, and without a
# torch already present pip resolves a multi-GB CUDA build. Versions are the ones the tests ran on.
set -euo pipefail
VENV="${1:?usage: $0 /path/to/venv}"
PY="$VENV/bin/python"
[ -x "$PY" ] || { echo "no python at $PY" >&2; exit 2; }

TORCH_VERSION="2.13.0"
RAY_VERSION="2.60.0"
TQ_VERSION="0.1.11"
VERL_VERSION="0.9.1"

have() {  # have <import name> <version prefix>
  "$PY" - "$1" "$2" <<'PYEOF' 2>/dev/null
import importlib.metadata as md, sys
dist = {"torch": "torch", "ray": "ray", "transfer_queue": "TransferQueue", "verl": "verl"}[sys.argv[1]]
try:
    v = md.version(dist)
except md.PackageNotFoundError:
    sys.exit(1)
sys.exit(0 if v.startswith(sys.argv[2]) else 1)
PYEOF
}

if have torch "$TORCH_VERSION"; then echo "torch $TORCH_VERSION present"; else
  # Honours the pip configuration (a local wheelhouse with the CPU build, in our CI). Elsewhere set
  # OMNIWATCH_TORCH_INDEX to the URL of an index that serves the CPU build.
  "$PY" -m pip install "torch==$TORCH_VERSION" ${OMNIWATCH_TORCH_INDEX:+--index-url "$OMNIWATCH_TORCH_INDEX"}
fi
if have ray "$RAY_VERSION"; then echo "ray $RAY_VERSION present"; else
  "$PY" -m pip install "ray[default]==$RAY_VERSION"
fi
# py-spy: ray[default] depends on it (Ray's dashboard runs it for /task/traceback, the stack of a held call:
# tests/test_hang_live.py); a Ray installed without the extra lacks it.
if "$PY" -c "import shutil, sys, os; sys.exit(0 if shutil.which('py-spy', path=os.path.dirname(sys.executable)) else 1)"; then
  echo "py-spy present"; else "$PY" -m pip install "py-spy>=0.4,<0.5"; fi
if have transfer_queue "$TQ_VERSION"; then echo "transferqueue $TQ_VERSION present"; else
  "$PY" -m pip install "transferqueue==$TQ_VERSION"
fi
# verl's real single controller (RayResourcePool, RayWorkerGroup, create_colocated_worker_cls, @register) for the
# task-event tests (tests/test_raytasks_live.py). --no-deps: verl's own requirements pull vLLM-era GPU stacks; its
# single_controller needs only what is already here (ray, torch, tensordict, numpy, omegaconf) plus transformers,
# which verl/__init__ -> protocol -> utils/torch_functional imports at load. 0.9.1: the PyPI release whose
# single_controller/ray/base.py equals VeRL-Omni's verl pin (8a694930) but for one runtime_env refactor.
if have verl "$VERL_VERSION"; then echo "verl $VERL_VERSION present"; else
  "$PY" -m pip install --no-deps "verl==$VERL_VERSION"
  "$PY" -m pip install "transformers>=5.5.3,<5.11,!=5.6.0"   # verl 0.9.1's own bound
fi
"$PY" -c "import ray, transfer_queue, torch, tensordict; print('ok: ray', ray.__version__, 'torch', torch.__version__)"
"$PY" -c "from verl.single_controller.ray import RayWorkerGroup, create_colocated_worker_cls; import verl; print('ok: verl', verl.__version__)"
