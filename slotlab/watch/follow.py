"""Where a live watch gets its lines: a log file followed like `tail -F`, or a server started as a child
process whose stdout and stderr are read.

Both are polled (`poll()` returns the complete lines that arrived since the last call, never blocks
long) and bounded: at most `max_bytes` are read per call, a line longer than `MAX_LINE` is cut (the
reader cuts at 64 KiB anyway), and nothing grows without bound while nobody polls (the child's lines
wait in a bounded queue; the oldest are dropped and counted when it overflows)."""

from __future__ import annotations

import collections
import os
import subprocess
import threading
import time
from pathlib import Path

#: a line longer than this is cut here (the rest up to its newline is dropped)
MAX_LINE = 1 << 20
#: lines a child may print ahead of the watch before the oldest are dropped
MAX_QUEUED = 200_000


class FileFollower:
    """Follow `path` like `tail -F`: new complete lines on each `poll()`.

    * the file may not exist yet (a server that has not started): polling waits for it;
    * rotation by rename (logrotate's default, `--log-file` reopened by a restarted server): the old
      file is read to its end, then the new one from its start;
    * truncation in place (`copytruncate`, `> file`): reading restarts at 0;
    * a last line without its newline is held until the newline comes (or the file rotates).

    `from_start=False` skips what the file holds when following starts (attach to a running server).
    `notes` collects what happened to the file (rotated, truncated, appeared, vanished) for the watch
    to report; `poll()` returns lines only."""

    def __init__(self, path: str | Path, *, from_start: bool = True, max_bytes: int = 4 << 20):
        self.path = Path(path)
        self.from_start = from_start
        self.max_bytes = max_bytes
        self._f = None
        self._ino: tuple[int, int] | None = None
        self._pos = 0
        self._buf = b""
        self._skip_to_nl = False
        self.notes: collections.deque = collections.deque(maxlen=100)
        self.n_rotations = 0
        self.n_truncations = 0
        self._missing_noted = False
        self._open(initial=True)

    def _open(self, initial: bool = False) -> bool:
        try:
            f = open(self.path, "rb")
        except OSError:
            if not self._missing_noted:
                self.notes.append(f"waiting for {self.path} to appear")
                self._missing_noted = True
            return False
        st = os.fstat(f.fileno())
        self._f, self._ino = f, (st.st_dev, st.st_ino)
        self._pos = st.st_size if (initial and not self.from_start) else 0
        f.seek(self._pos)
        if self._missing_noted:
            self.notes.append(f"{self.path} appeared")
            self._missing_noted = False
        return True

    def _read(self, limit: int) -> bytes:
        data = self._f.read(limit)
        self._pos += len(data)
        return data

    def poll(self) -> list[bytes]:
        """The complete lines appended since the last call (bytes, newline kept)."""
        if self._f is None and not self._open():
            return []
        out: list[bytes] = []
        budget = self.max_bytes
        data = self._read(budget)
        budget -= len(data)
        if data:
            out += self._split(data)
        if budget > 0:  # at the end of what the file holds: was it rotated or truncated?
            try:
                st = os.stat(self.path)
                now = (st.st_dev, st.st_ino)
            except OSError:
                now = None
            if now is not None and now != self._ino:
                out += self._split(self._read(budget))  # the old file's last lines
                if self._buf:
                    out.append(self._buf)
                    self._buf = b""
                self._f.close()
                self._f = None
                self.n_rotations += 1
                self.notes.append(f"{self.path} was rotated: following the new file")
                if self._open():
                    out += self._split(self._read(max(budget, 1 << 16)))
            elif now is not None and st.st_size < self._pos:
                self.n_truncations += 1
                self.notes.append(f"{self.path} was truncated: reading it from the start")
                self._f.seek(0)
                self._pos = 0
                self._buf = b""
                out += self._split(self._read(budget))
        return out

    def _split(self, data: bytes) -> list[bytes]:
        if not data:
            return []
        data = self._buf + data
        lines = data.split(b"\n")
        self._buf = lines.pop()
        out = []
        for ln in lines:
            if self._skip_to_nl:
                self._skip_to_nl = False
                continue
            out.append(ln[:MAX_LINE] + b"\n")
        if len(self._buf) > MAX_LINE:  # a huge line in progress: keep its head, drop the rest
            out.append(self._buf[:MAX_LINE] + b"\n")
            self._buf = b""
            self._skip_to_nl = True
        return out

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class ChildProcess:
    """A server started as a child: `cmd` with stdout and stderr merged into one pipe (the order the
    server printed them in), read line by line by a thread into a bounded queue. `tee`: a file that
    gets every byte too (the log a later `slotlab watch --log` can read)."""

    def __init__(self, cmd: list[str], *, tee: str | Path | None = None, env: dict | None = None):
        if not cmd:
            raise ValueError("no command to start")
        self.cmd = list(cmd)
        self.env = env
        self.tee_path = Path(tee) if tee else None
        self.proc: subprocess.Popen | None = None
        self._q: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.n_dropped = 0
        self.n_starts = 0
        self.started_at = 0.0

    def start(self) -> None:
        """Start (or restart) the process. Raises OSError when the command cannot be run."""
        tee = open(self.tee_path, "ab") if self.tee_path else None
        try:
            self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.env, bufsize=0)
        except OSError:
            if tee:
                tee.close()
            raise
        self.n_starts += 1
        self.started_at = time.time()
        self._thread = threading.Thread(target=self._pump, args=(self.proc, tee), name="slotlab-watch-child",
                                        daemon=True)
        self._thread.start()

    def _pump(self, proc: subprocess.Popen, tee) -> None:
        buf = b""
        try:
            while True:
                data = os.read(proc.stdout.fileno(), 1 << 16)  # what is there now (one read)
                if not data:
                    break
                if tee:
                    tee.write(data)
                    tee.flush()
                buf += data
                if b"\n" not in data and len(buf) <= MAX_LINE:
                    continue
                lines = buf.split(b"\n")
                buf = lines.pop()
                if len(buf) > MAX_LINE:
                    lines.append(buf[:MAX_LINE])
                    buf = b""
                self._put([ln[:MAX_LINE] + b"\n" for ln in lines])
            if buf:
                self._put([buf])
        except OSError:  # the pipe went away with the process
            pass
        finally:
            proc.stdout.close()
            if tee:
                tee.close()

    def _put(self, lines: list[bytes]) -> None:
        with self._lock:
            self._q.extend(lines)
            over = len(self._q) - MAX_QUEUED
            for _ in range(max(0, over)):
                self._q.popleft()
                self.n_dropped += 1

    def poll(self) -> list[bytes]:
        with self._lock:
            out = list(self._q)
            self._q.clear()
        return out

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def exited(self) -> int | None:
        """The exit code once the process has exited and its output has been read to the end; else None."""
        if self.proc is None:
            return None
        rc = self.proc.poll()
        if rc is None:
            return None
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(0.5)
            if self._thread.is_alive():
                return None
        return rc

    def stop(self, timeout: float = 10) -> None:
        """Terminate the process (then kill it after `timeout`), and wait for the reader thread."""
        p = self.proc
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        if self._thread is not None:
            self._thread.join(5)
