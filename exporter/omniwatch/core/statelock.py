"""One exporter per ``--state-dir``: an exclusive ``flock`` on ``<state-dir>/exporter.lock``, held for the
life of the process (the kernel drops it when the process dies, SIGKILL included, so a stale lock file never
blocks a restart). Two exporters on one directory would both deliver the relay outbox (every notification
twice), overwrite each other's checkpoint and wait on each other's SQLite write lock; the second is refused
at start with the first one's pid. A directory where the lock cannot be taken at all (unwritable, disk full)
is not refused here: the state and relay layers report that themselves and serve on in memory."""
from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)
LOCK_NAME = "exporter.lock"


class StateDirBusy(RuntimeError):
    """Another live process holds the state directory."""


class StateDirLock:
    def __init__(self, state_dir: str):
        self.path = Path(state_dir) / LOCK_NAME
        self.fd: int | None = None

    def acquire(self) -> "StateDirLock":
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            log.warning("cannot create %s (%s); running without the one-exporter-per-state-dir lock", self.path, e)
            return self
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            except OSError:
                holder = "unknown"
            os.close(fd)
            raise StateDirBusy(f"another omniwatch exporter (pid {holder}) already uses --state-dir "
                               f"{self.path.parent} ({self.path} is locked); two exporters on one state directory "
                               "would send every alert twice and overwrite each other's state. Stop it, or give "
                               "this one its own --state-dir.") from None
        except OSError as e:  # a filesystem without flock: say so, carry on
            os.close(fd)
            log.warning("cannot lock %s (%s); running without the one-exporter-per-state-dir lock", self.path, e)
            return self
        self.fd = fd
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # the pid is only for the message above; a full disk must not stop the exporter
        return self

    def release(self) -> None:
        if self.fd is not None:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = None


def write_atomic(path, blob: bytes) -> None:
    """Write ``blob`` to ``path`` as one step (a temporary file beside it, fsynced, renamed over it), so a reader
    or a crash never sees half a checkpoint; raises ``OSError`` (disk full, read-only) after removing the
    temporary file. Every checkpoint in the state directory goes through here."""
    tmp = path.with_suffix(".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise


class Checkpoint:
    """One checkpoint file: written through :func:`write_atomic` only when its bytes changed, remembering why the
    last write failed, so its owner says a failure once per cause and a recovery once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.error: str | None = None   # why the last write failed; None after a success
        self.error_is_new = False       # the last failure's cause differs from the one before it
        self.recovered = False          # the last write succeeded after a failure
        self._last_blob: bytes | None = None

    def write(self, blob: bytes) -> bool:
        """True when the file holds ``blob`` (written now, or unchanged since the last write); False when the
        write failed (``error`` says why)."""
        self.recovered = False
        if blob == self._last_blob:
            return True
        try:
            write_atomic(self.path, blob)
        except OSError as e:
            cause = f"{type(e).__name__}: {e.strerror or e}"
            self.error_is_new, self.error = cause != self.error, cause
            return False
        self.recovered = self.error is not None
        self.error, self._last_blob = None, blob
        return True

