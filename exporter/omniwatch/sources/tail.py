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

Descriptors and CPU are bounded for watches of thousands of files (see below and ``FileSource``).

Descriptors. A tail does not hold its file open between polls: a poll starts with one ``stat`` of the
path, and a file whose (inode, size, mtime) did not change since the last read is not opened at all.
A changed file is read through an :class:`FdPool`, which keeps at most ``capacity`` descriptors of one
source open, closing the least recently *active* first — so the files being written keep their
descriptor (a rotated-and-deleted active file is still drained from it), and a watch of thousands of
idle files costs one ``stat`` each per poll, not one descriptor each forever. A file whose descriptor
was closed is found again by its inode: a rotation while it was closed is drained from the renamed file
in the same directory.
"""
from __future__ import annotations

import errno
import os
import stat
from collections import OrderedDict
from dataclasses import dataclass, field

READ_CHUNK = 1 << 20
MAX_READ_PER_POLL = 16 << 20
HEAD_BYTES = 4096
DEFAULT_MAX_OPEN = 128


def _statx():
    """libc's ``statx`` (glibc >= 2.28, Linux >= 4.11), or None: Python 3.11's ``os.stat`` has no birth time."""
    import ctypes
    try:
        fn = ctypes.CDLL(None, use_errno=True).statx
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


_STATX = _statx()
_AT_FDCWD, _STATX_BTIME = -100, 0x800
# struct statx (include/uapi/linux/stat.h): stx_mask at 0 (u32), stx_btime at 80 (s64 tv_sec, u32 tv_nsec); 256 bytes


def birth_time(path: str) -> float | None:
    """When the file was created (statx ``stx_btime``), or None where the kernel, libc or file system does not say
    (NFS, old kernels): a copy's birth is its copy time, whatever mtime it was given."""
    if _STATX is None:
        return None
    import ctypes
    import struct
    buf = ctypes.create_string_buffer(256)
    if _STATX(_AT_FDCWD, os.fsencode(path), 0, _STATX_BTIME, buf) != 0:
        return None
    mask = struct.unpack_from("<I", buf.raw, 0)[0]
    if not mask & _STATX_BTIME:
        return None
    sec, nsec = struct.unpack_from("<qI", buf.raw, 80)
    return sec + nsec / 1e9 if sec > 0 else None


@dataclass
class PollResult:
    lines: list[bytes] = field(default_factory=list)
    backlog: int = 0          # how many of ``lines`` were already in the file when it was opened
    events: list[str] = field(default_factory=list)  # opened, truncated, rotated, missing
    too_long: int = 0


UNCHANGED = PollResult()  # what poll() returns for a file that did not change (shared: never mutate it)


class NotRegularFile(OSError):
    """The path is a FIFO, a device, a directory, ...: never opened, never read."""


class OutsideRoot(OSError):
    """The path resolves (through a symlink) outside the directory it was found in."""


class FdPool:
    """At most ``capacity`` open descriptors for the tails of one source (one polling thread), the least
    recently active closed first. Not thread-safe on purpose: one pool per source thread."""

    def __init__(self, capacity: int = DEFAULT_MAX_OPEN):
        self.capacity = max(1, int(capacity))
        self._open: OrderedDict[int, tuple[int, "FileTail"]] = OrderedDict()  # id(tail) -> (fd, tail)
        self.opened_total = 0

    def __len__(self) -> int:
        return len(self._open)

    def get(self, tail: "FileTail") -> int | None:
        item = self._open.get(id(tail))
        if item is None:
            return None
        self._open.move_to_end(id(tail))
        return item[0]

    def put(self, tail: "FileTail", fd: int) -> None:
        self.release(tail)
        while len(self._open) >= self.capacity:
            _, (old, _t) = self._open.popitem(last=False)
            os.close(old)
        self._open[id(tail)] = (fd, tail)
        self.opened_total += 1

    def release(self, tail: "FileTail") -> None:
        item = self._open.pop(id(tail), None)
        if item is not None:
            os.close(item[0])

    def close_all(self) -> None:
        while self._open:
            _, (fd, _t) = self._open.popitem()
            os.close(fd)


def inside(root: str, path: str) -> bool:
    """``path`` (resolved) is ``root`` (resolved) or below it."""
    real = os.path.realpath(path)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def link_free(checks: list[str]) -> bool:
    """None of ``checks`` (the path components below a watch root) is a symlink now: two ``lstat`` calls
    for ``<root>/<project>/<experiment>.jsonl`` instead of a full ``realpath``."""
    return not any(stat.S_ISLNK(os.lstat(c).st_mode) for c in checks)


def escapes(root: str, path: str, checks: list[str] | None) -> bool:
    """``path`` leads out of ``root``: checked cheaply when no component below the root is a symlink
    (``checks``), by resolving the path otherwise (or when ``checks`` is None)."""
    if checks is not None and link_free(checks):
        return False
    return not inside(root, path)


class FileTail:
    def __init__(self, path: str, max_line: int = 1 << 20, pool: FdPool | None = None,
                 confine: str | None = None, checks: list[str] | None = None):
        self.path = path
        self.max_line = max_line
        # No pool given (a tail used alone): a private pool of one, i.e. the file stays open as before.
        self.pool = pool if pool is not None else FdPool(1)
        self.confine = confine  # resolved root the file must stay inside (symlinks out of it refused)
        self.checks = checks    # the path's components below that root (see ``escapes``)
        self._ino: tuple[int, int] | None = None
        self._offset = 0
        self._buf = bytearray()
        self._skipping = False
        self._head = b""
        self._backlog_end = 0  # file size when opened: lines ending before it are backlog
        self._resume: dict | None = None  # saved position from an exporter checkpoint
        self._seen: tuple[int, int] | None = None  # (size, mtime_ns) when last read to its end
        self._mtime: float | None = None
        self.unchanged_polls = 0  # polls in a row that found the file as it was (FileSource polls those less)
        self.slot = 0  # FileSource's spread of idle looks over the passes

    # -- checkpoint support (core/state.py) -----------------------------------------------------------
    def position(self) -> dict | None:
        """Where the next read starts; only complete lines before it have been handed out."""
        if self._ino is None:
            return None
        return {"dev": self._ino[0], "ino": self._ino[1], "offset": self._offset - len(self._buf),
                "head": self._head.hex()}

    def resume_from(self, pos: dict) -> None:
        self._resume = pos

    def close(self) -> None:
        self.pool.release(self)

    @property
    def opened(self) -> bool:
        """Read at least once (a first read opens the file and reads its whole backlog)."""
        return self._ino is not None

    @property
    def is_open(self) -> bool:
        return self.pool.get(self) is not None

    @property
    def mtime(self) -> float | None:
        """mtime seen by the last poll (no extra syscall)."""
        return self._mtime

    # -- descriptors ----------------------------------------------------------------------------------
    def _open_fd(self, path: str) -> tuple[int, os.stat_result]:
        # checked again at every open: a path accepted by the scan may have been swapped for a symlink since
        if self.confine is not None and escapes(self.confine, path, self.checks if path == self.path else None):
            raise OutsideRoot(errno.EPERM, f"{path} resolves outside {self.confine}")
        # O_NONBLOCK: a FIFO or device named as a log must not block the polling thread in open().
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise NotRegularFile(errno.EINVAL, f"{path} is not a regular file")
        return fd, st

    def _fd(self) -> int | None:
        """The descriptor of the file we follow (inode ``_ino``), from the pool or opened again by path;
        None when the path now names another file (rotated since: the next poll sees it)."""
        fd = self.pool.get(self)
        if fd is not None:
            return fd
        try:
            fd, st = self._open_fd(self.path)
        except FileNotFoundError:
            return None
        if (st.st_dev, st.st_ino) != self._ino:
            os.close(fd)
            return None
        self.pool.put(self, fd)
        return fd

    def _find_by_inode(self, ino: tuple[int, int]) -> str | None:
        """The file with inode ``ino`` in our directory (a rotation renamed it beside the new one)."""
        d = os.path.dirname(self.path) or "."
        try:
            entries = list(os.scandir(d))
        except OSError:
            return None
        for e in entries:
            try:
                est = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if (est.st_dev, est.st_ino) == ino and stat.S_ISREG(est.st_mode):
                return e.path
        return None

    def _drain_old(self, res: PollResult) -> None:
        """Finish the file we followed before it was rotated away or deleted: from our descriptor when the
        pool still holds it, else from the renamed file found by inode (a deleted file whose descriptor
        was closed cannot be read: only an idle file loses its descriptor)."""
        fd = self.pool.get(self)
        if fd is not None:
            self._drain(res, fd)
            self.close()
            return
        if self._ino is None:
            return
        old = self._find_by_inode(self._ino)
        if old is None:
            return
        try:
            fd = os.open(old, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return
        try:
            ost = os.fstat(fd)
            if (ost.st_dev, ost.st_ino) == self._ino:
                self._drain(res, fd)
        finally:
            os.close(fd)

    # -- opening ----------------------------------------------------------------------------------------
    def _open(self, res: PollResult, event: str) -> bool:
        try:
            fd, st = self._open_fd(self.path)
        except FileNotFoundError:
            return False
        self.pool.put(self, fd)
        self._ino = (st.st_dev, st.st_ino)
        self._offset, self._buf, self._skipping, self._head = 0, bytearray(), False, b""
        self._seen = None
        self._backlog_end = st.st_size if event == "opened" else 0
        resume, self._resume = self._resume, None
        if resume is not None and event == "opened" and (st.st_dev, st.st_ino) != (resume["dev"], resume["ino"]):
            self._drain_predecessor(resume, res)  # rotated while we were down: finish the old file first
        if resume is not None and event == "opened":
            head = bytes.fromhex(resume.get("head", ""))
            same = (st.st_dev, st.st_ino) == (resume["dev"], resume["ino"]) and st.st_size >= resume["offset"] \
                and (not head or os.pread(fd, len(head), 0) == head)
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
        old_path = self._find_by_inode((resume["dev"], resume["ino"]))
        if old_path is None:
            return
        old = FileTail(old_path, self.max_line)
        try:
            fd = os.open(old_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                est = os.fstat(fd)
                old._ino, old._offset = (est.st_dev, est.st_ino), resume["offset"]
                old._backlog_end = est.st_size  # read while catching up, like the new file's backlog
                old._drain(res, fd)
            finally:
                os.close(fd)
        except OSError:
            pass
        res.events.append("drained_rotated")

    # -- reading ----------------------------------------------------------------------------------------
    def _drain(self, res: PollResult, fd: int) -> None:
        budget = MAX_READ_PER_POLL
        while budget > 0:
            chunk = os.pread(fd, min(READ_CHUNK, budget), self._offset)
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
        if budget <= 0:
            self._seen = None  # more to read: look again next poll whatever stat says
        if not self._head and self._offset:
            first = os.pread(fd, HEAD_BYTES, 0)
            nl = first.find(b"\n")
            self._head = first[: nl + 1] if nl >= 0 else b""

    def poll(self) -> PollResult:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            res = PollResult()
            if self._ino is not None:
                self._drain_old(res)  # moved away or deleted: finish what was written
                self.close()
                self._ino, self._seen = None, None
            res.events.append("missing")
            return res
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, f"{self.path} is not a regular file")
        self._mtime = st.st_mtime
        key = (st.st_size, st.st_mtime_ns)
        if key == self._seen and self._ino is not None and (st.st_dev, st.st_ino) == self._ino:
            self.unchanged_polls += 1
            return UNCHANGED  # the common case of an idle file: one stat, nothing allocated
        res = PollResult()
        if self._ino is None:
            if not self._open(res, "opened"):
                res.events.append("missing")
                return res
        elif (st.st_dev, st.st_ino) != self._ino:
            self._drain_old(res)
            self._open(res, "rotated")
        elif key == self._seen:
            self.unchanged_polls += 1
            return UNCHANGED  # unchanged since we read it to its end: no descriptor, no read
        self.unchanged_polls = 0
        fd = self._fd()
        if fd is None:
            return res  # replaced between stat and open: the next poll sees the rotation
        if self._head or st.st_size < self._offset:
            size = os.fstat(fd).st_size
            rewritten = bool(self._head) and size >= len(self._head) and \
                os.pread(fd, len(self._head), 0) != self._head
            if size < self._offset or (self._head and size < len(self._head)) or rewritten:
                self._offset, self._buf, self._skipping, self._head = 0, bytearray(), False, b""
                self._backlog_end = 0
                res.events.append("truncated")
        self._seen = key
        self._drain(res, fd)
        return res
