"""One Ray cluster starts at a time on this machine: the Ray scenarios (tests/*_scenario.py) take this lock
around ``ray.init`` / ``ray start`` / ``Cluster(...)``. Ray waits a fixed 30 s (wall clock, not configurable)
for a raylet to register with its GCS; several clusters starting at once on 2 cores (parallel pytest
workers, a second ``make test`` beside this one) miss it although nothing is wrong. The lock is a file under
the temp dir, so it holds across the scenarios' private network namespaces (``unshare -n`` shares the
filesystem). Only the start is serialized; the clusters then run side by side."""
from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile

LOCK = os.path.join(tempfile.gettempdir(), "omniwatch-ray-start.lock")


@contextlib.contextmanager
def ray_start_lock():
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
