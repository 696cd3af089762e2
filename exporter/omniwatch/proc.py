"""Ports, polling and child processes: the one ``free_port``, ``poll``/``wait_for`` and ``stop`` that the
package (native stack, temporary Prometheus, discovery helper, demo) and its tests and benchmarks share.

Every loop here is bounded by a timeout; ``stop`` escalates SIGTERM -> SIGKILL and always reaps.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from typing import Any, Callable


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the kernel picks it; the caller binds it soon after)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _poll(fn: Callable[[], Any], timeout: float, interval: float) -> tuple[Any, Any]:
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            v = fn()
        except Exception as e:  # noqa: BLE001 - keep polling (a process still starting), remember why
            last = e
        else:
            if v:
                return v, None
            last = v
        if time.monotonic() >= deadline:
            return None, last
        time.sleep(interval)


def poll(fn: Callable[[], Any], timeout: float, interval: float = 0.2) -> Any:
    """Call ``fn`` until it returns something truthy (returned) or ``timeout`` seconds pass (None).
    An exception from ``fn`` counts as not yet."""
    return _poll(fn, timeout, interval)[0]


def wait_for(fn: Callable[[], Any], timeout: float = 30.0, interval: float = 0.2,
             what: str = "condition") -> Any:
    """``poll`` that raises ``TimeoutError`` naming ``what`` and the last value or error on timeout."""
    v, last = _poll(fn, timeout, interval)
    if v:
        return v
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def _gone(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return True
    except ChildProcessError:
        pass  # not our child: fall through to a signal-0 probe
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # a zombie that another process will reap counts as gone
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] == b"Z"
    except OSError:
        return True


def stop(target: subprocess.Popen | int, timeout: float = 10.0, group: bool = False,
         alive: Callable[[], bool] | None = None) -> bool:
    """Stop a child (a ``Popen``) or a pid: SIGTERM, wait up to ``timeout`` s, then SIGKILL and reap.

    ``group=True`` signals the process group the target leads (started with ``start_new_session``).
    ``alive`` overrides the liveness check (the native stack checks its pid file against /proc).
    Returns True if the process was still running when asked to stop."""
    if isinstance(target, subprocess.Popen):
        if target.poll() is not None:
            return False
        pid = target.pid
        is_alive = alive or (lambda: target.poll() is None)
    else:
        pid = int(target)
        is_alive = alive or (lambda: not _gone(pid))
        if not is_alive():
            return False

    def send(sig: int) -> None:
        try:
            if group:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    send(signal.SIGTERM)
    if not poll(lambda: not is_alive(), timeout, 0.05):
        send(signal.SIGKILL)
        poll(lambda: not is_alive(), 10.0, 0.05)
    if isinstance(target, subprocess.Popen):
        try:
            target.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    else:
        _gone(pid)  # reap if it is our child
    return True
