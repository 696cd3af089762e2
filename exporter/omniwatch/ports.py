"""Who holds a TCP port: so ``omniwatch up`` never takes another process's ``/healthz`` for its own.

:func:`in_use` tries to bind the address (with ``SO_REUSEADDR``, as Prometheus and uvicorn bind: a port
left in TIME_WAIT by a stopped process is free, a listener is not). :func:`listeners` reads the kernel's
socket tables (``/proc/net/tcp``, ``tcp6``) and the ``/proc/<pid>/fd`` links to name the process that
listens on a port; another user's process cannot be named (its fds are not readable), which is said as such.
"""
from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

LISTEN = "0A"


def in_use(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e.errno in (errno.EADDRINUSE, errno.EACCES)
    return False


def _listen_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if len(f) > 9 and f[3] == LISTEN and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f[9])
    return inodes


def listeners(port: int) -> list[int] | None:
    """Pids of the processes listening on ``port`` that this user can see; None when the kernel's tables
    cannot be read here (not Linux); [] when something listens but its process is not visible."""
    if not Path("/proc/net/tcp").exists():
        return None
    inodes = _listen_inodes(port)
    if not inodes:
        return []
    wanted = {f"socket:[{i}]" for i in inodes}
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            for fd in os.scandir(d / "fd"):
                try:
                    if os.readlink(fd.path) in wanted:
                        pids.append(int(d.name))
                        break
                except OSError:
                    continue
        except OSError:
            continue
    return sorted(pids)


def cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(a.decode(errors="replace") for a in raw.split(b"\0") if a)[:120] or "?"


def describe_holder(port: int) -> str:
    """``pid 123 (python3 -m http.server 19095)``, or why the holder cannot be named."""
    pids = listeners(port)
    if pids is None:
        return "another process"
    if not pids:
        return "a process this user cannot see (another user's, or another network namespace)"
    return ", ".join(f"pid {p} ({cmdline(p)})" for p in pids[:3])


def owned_by(port: int, pid: int) -> bool | None:
    """Whether the listener on ``port`` is ``pid`` or one of its descendants (same session: the stack starts
    each component in its own session); None when it cannot be told here."""
    pids = listeners(port)
    if not pids:
        return None
    for p in pids:
        if p == pid:
            return True
        try:
            if os.getsid(p) == pid:
                return True
        except OSError:
            continue
    return False
