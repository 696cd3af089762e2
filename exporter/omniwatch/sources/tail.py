"""Follow a growing log file the way verl writes it.

verl's FileLogger opens its file with ``"wb"`` (a trainer restart truncates it in place) and writes one
unbuffered line per step; logrotate-style tools move it away and start a new one. ``FileTail.poll``
returns the new complete lines and tells what happened to the file:

- a partial last line waits for its newline;
- a line longer than ``max_line`` is skipped whole (counted), without holding it in memory;
- truncation is seen when the file shrinks below the read offset *or* its first line changed (a restarted
  trainer may have written more than we had read before we looked again);
- rotation (a new inode at the path) drains the old file to its end first;
- a missing file is waited for.
"""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field

READ_CHUNK = 1 << 20
MAX_READ_PER_POLL = 16 << 20
HEAD_BYTES = 4096


@dataclass
class PollResult:
    lines: list[bytes] = field(default_factory=list)
    backlog: int = 0          # how many of ``lines`` were already in the file when it was opened
    events: list[str] = field(default_factory=list)  # opened, truncated, rotated, missing
    too_long: int = 0


class FileTail:
    def __init__(self, path: str, max_line: int = 1 << 20):
        self.path = path
        self.max_line = max_line
        self._f = None
        self._ino: tuple[int, int] | None = None
        self._offset = 0
        self._buf = bytearray()
        self._skipping = False
        self._head = b""
        self._backlog_end = 0  # file size when opened: lines ending before it are backlog
        self._resume: dict | None = None  # saved position from an exporter checkpoint

    # -- checkpoint support (state.py) ----------------------------------------------------------------
    def position(self) -> dict | None:
        """Where the next read starts; only complete lines before it have been handed out."""
        if self._f is None or self._ino is None:
            return None
        return {"dev": self._ino[0], "ino": self._ino[1], "offset": self._offset - len(self._buf),
                "head": self._head.hex()}

    def resume_from(self, pos: dict) -> None:
        self._resume = pos

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    @property
    def mtime(self) -> float | None:
        try:
            return os.stat(self.path).st_mtime
        except OSError:
            return None

    def _open(self, res: PollResult, event: str) -> bool:
        try:
            # O_NONBLOCK: a FIFO or device named as a log must not block the polling thread in open().
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return False
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, f"{self.path} is not a regular file")
        f = os.fdopen(fd, "rb", buffering=0)
        self.close()
        self._f, self._ino = f, (st.st_dev, st.st_ino)
        self._offset, self._buf, self._skipping, self._head = 0, bytearray(), False, b""
        self._backlog_end = st.st_size if event == "opened" else 0
        resume, self._resume = self._resume, None
        if resume is not None and event == "opened" and (st.st_dev, st.st_ino) != (resume["dev"], resume["ino"]):
            self._drain_predecessor(resume, res)  # rotated while we were down: finish the old file first
        if resume is not None and event == "opened":
            head = bytes.fromhex(resume.get("head", ""))
            same = (st.st_dev, st.st_ino) == (resume["dev"], resume["ino"]) and st.st_size >= resume["offset"] \
                and (not head or os.pread(f.fileno(), len(head), 0) == head)
            if same:
                self._offset, self._head = resume["offset"], head
                res.events.append("resumed")
                return True
            event = "truncated" if (st.st_dev, st.st_ino) == (resume["dev"], resume["ino"]) else "rotated"
        res.events.append(event)
        return True

    def _drain_predecessor(self, resume: dict, res: PollResult) -> None:
        """The file we checkpointed was rotated away while the exporter was down (logrotate renames it
        beside the new one): find it by inode in the same directory and read what came after our
        checkpoint, so no step written between the checkpoint and the rotation is lost."""
        d = os.path.dirname(self.path) or "."
        try:
            entries = list(os.scandir(d))
        except OSError:
            return
        for e in entries:
            try:
                est = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if (est.st_dev, est.st_ino) != (resume["dev"], resume["ino"]) or not stat.S_ISREG(est.st_mode):
                continue
            old = FileTail(e.path, self.max_line)
            try:
                fd = os.open(e.path, os.O_RDONLY | os.O_NONBLOCK)
                old._f, old._ino, old._offset = os.fdopen(fd, "rb", buffering=0), (est.st_dev, est.st_ino), resume["offset"]
                old._backlog_end = est.st_size  # read while catching up, like the new file's backlog
                old._drain(res)
            except OSError:
                pass
            finally:
                old.close()
            res.events.append("drained_rotated")
            return

    def _read_head(self) -> bytes:
        return os.pread(self._f.fileno(), HEAD_BYTES, 0)

    def _drain(self, res: PollResult) -> None:
        budget = MAX_READ_PER_POLL
        while budget > 0:
            chunk = os.pread(self._f.fileno(), min(READ_CHUNK, budget), self._offset)
            if not chunk:
                break
            budget -= len(chunk)
            start_off = self._offset
            self._offset += len(chunk)
            pos = 0
            while True:
                nl = chunk.find(b"\n", pos)
                if nl < 0:
                    rest = chunk[pos:]
                    if self._skipping:
                        break
                    if len(self._buf) + len(rest) > self.max_line:
                        self._buf.clear()
                        self._skipping = True
                        res.too_long += 1
                    else:
                        self._buf += rest
                    break
                piece = chunk[pos:nl]
                line_end = start_off + nl + 1
                if self._skipping:
                    self._skipping = False
                elif len(self._buf) + len(piece) > self.max_line:
                    self._buf.clear()
                    res.too_long += 1
                else:
                    line = bytes(self._buf + piece) if self._buf else bytes(piece)
                    self._buf.clear()
                    if line.strip():
                        res.lines.append(line)
                        if line_end <= self._backlog_end:
                            res.backlog += 1
                pos = nl + 1
        if not self._head and self._offset:
            first = self._read_head()
            nl = first.find(b"\n")
            self._head = first[: nl + 1] if nl >= 0 else b""

    def poll(self) -> PollResult:
        res = PollResult()
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self._f is not None:
                self._drain(res)  # moved away or deleted: finish what was written
                self.close()
                self._ino = None
            res.events.append("missing")
            return res
        if self._f is None:
            if not self._open(res, "opened"):
                res.events.append("missing")
                return res
        elif (st.st_dev, st.st_ino) != self._ino:
            self._drain(res)
            self._open(res, "rotated")
        else:
            size = os.fstat(self._f.fileno()).st_size
            rewritten = bool(self._head) and size >= len(self._head) and self._read_head()[: len(self._head)] != self._head
            if size < self._offset or (self._head and size < len(self._head)) or rewritten:
                self._offset, self._buf, self._skipping, self._head = 0, bytearray(), False, b""
                self._backlog_end = 0
                res.events.append("truncated")
        self._drain(res)
        return res
