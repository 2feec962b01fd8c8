"""Lifecycle of one engine server process: start, wait until healthy, stop, never leak.

The server runs under `engine_adapter._guard` in a new process group. The tuner holds the only
write end of a pipe on the guard's stdin, so the guard (and through it the whole group) goes down
when the tuner exits for any reason, SIGKILL included. `stop()` sends SIGTERM to the group, waits,
then SIGKILLs what is left, and returns only when no process of the group remains.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tracetune.engine_adapter._guard import group_members
from tracetune.errors import EngineError, EngineStartError, EngineTimeoutError


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the server binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tail_lines(path: Path, n: int = 40) -> str:
    """The last `n` lines of a text file ('' if it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            data = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(collections.deque(data.splitlines(), maxlen=n))


_ERROR_LINE = re.compile(r"(?:^|\] |^\(\S+ pid=\d+\) )((?:\w+\.)*\w*(?:Error|Exception)): (.+)$")
_WRAPPERS = ("see root cause above", "see stack trace", "initialization failed", "too many open files",
             "encountered an issue", "workerproc initialization failed")


# argparse's last words: "api_server.py: error: unrecognized arguments: --frobnicate"
_USAGE_LINE = re.compile(r"^\S+\.py: error: (.+)$")


def root_cause(log_text: str) -> str | None:
    """The first error line in an engine log that is not a wrapper around another one."""
    for line in log_text.splitlines():
        m = _ERROR_LINE.search(line.strip())
        if m and not any(w in m.group(2).lower() for w in _WRAPPERS):
            return f"{m.group(1)}: {m.group(2)}"[:500]
    for line in log_text.splitlines():
        m = _USAGE_LINE.match(line.strip())
        if m:
            return f"the engine refused its arguments: {m.group(1)}"[:500]
    return None


def group_alive(pgid: int) -> bool:
    """Whether any process (zombies aside) is left in process group `pgid`."""
    return bool(group_members(pgid))


class ServerProcess:
    """One server command run under the guard, with its log in `log_path`.

    Use as a context manager, or call `start()`, `wait_healthy()` and `stop()` yourself.
    """

    def __init__(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        log_path: Path,
        health_url: str,
        name: str = "engine",
    ) -> None:
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.health_url = health_url
        self.name = name
        self._proc: subprocess.Popen[bytes] | None = None
        self._pipe_w: int | None = None

    @property
    def pid(self) -> int | None:
        """PID of the guard, which is also the process group id."""
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        read_end, write_end = os.pipe()
        os.set_inheritable(read_end, True)
        log = open(self.log_path, "ab")
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tracetune.engine_adapter._guard", "--", *self.argv],
                stdin=read_end,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                close_fds=True,
                # A neutral folder: started from the source tree, `-m tracetune...` could find the
                # checkout's own tracetune/ folder (root modules only) before the installed package.
                cwd=str(self.log_path.parent),
            )
        finally:
            os.close(read_end)
            log.close()
        # Only this process holds the write end; the guard sees EOF when we are gone.
        os.set_inheritable(write_end, False)
        self._pipe_w = write_end

    def exit_code(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def log_tail(self, n: int = 40) -> str:
        return tail_lines(self.log_path, n)

    def wait_healthy(
        self,
        timeout_s: float,
        *,
        on_tick: Callable[[float], None] | None = None,
        poll_s: float = 0.5,
    ) -> float:
        """Poll the health URL until it answers 200; return the seconds it took.

        Raises EngineStartError if the process exits first and EngineTimeoutError after
        `timeout_s` (the process is stopped in both cases).
        """
        if self._proc is None:
            raise EngineError(f"{self.name} was never started")
        t0 = time.perf_counter()
        with httpx.Client(timeout=2.0) as client:
            while True:
                elapsed = time.perf_counter() - t0
                code = self._proc.poll()
                if code is not None:
                    self.stop()
                    cause = root_cause(tail_lines(self.log_path, 400))
                    raise EngineStartError(
                        f"{self.name} exited with code {code} after {elapsed:.1f}s, before it became healthy"
                        + (f": {cause}" if cause else ""),
                        exit_code=code,
                        log_tail=self.log_tail(),
                    )
                try:
                    if client.get(self.health_url).status_code == 200:
                        return time.perf_counter() - t0
                except httpx.HTTPError:
                    pass
                if elapsed > timeout_s:
                    tail = self.log_tail()
                    self.stop()
                    raise EngineTimeoutError(
                        f"{self.name} did not become healthy within {timeout_s:.0f}s "
                        f"(raise the start timeout if the model is large)",
                        log_tail=tail,
                    )
                if on_tick:
                    on_tick(elapsed)
                time.sleep(poll_s)

    def stop(self, grace_s: float = 15.0) -> int | None:
        """Stop the whole process group; return the guard's exit code. Idempotent."""
        if self._proc is None:
            return None
        pgid = self._proc.pid
        if self._proc.poll() is None:
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self._proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + grace_s
        while group_alive(pgid):
            if time.monotonic() > deadline:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:
                    break
            time.sleep(0.05)
        code = self._proc.wait()
        if self._pipe_w is not None:
            os.close(self._pipe_w)
            self._pipe_w = None
        return code

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
