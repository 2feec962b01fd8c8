"""Watchdog that runs an engine server and takes it down with its parent.

Usage (internal): python -m tracetune.engine_adapter._guard -- CMD ARGS...

The tuner starts this guard as the leader of a new process group, with a pipe on its stdin whose
write end only the tuner holds. The guard starts the server in the same group and waits. When
the pipe reaches EOF (the tuner exited, however it died, SIGKILL included) or the guard receives
SIGTERM/SIGINT, it sends SIGTERM to the server, waits a grace period, then SIGKILLs every process
left in its group (engine workers included), again and again until none is left. The guard exits
with the server's exit code.
This module imports nothing heavy and nothing from tracetune: it must start in milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1
GRACE_S = float(os.environ.get("TRACETUNE_ENGINE_STOP_GRACE_S", "10"))


def _set_parent_death_signal(sig: int) -> None:
    """Linux: deliver `sig` to this process when its parent dies (belt and braces with the pipe)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def group_members(pgid: int) -> list[int]:
    """PIDs in process group `pgid`, this process excluded (read from /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # Field 5 is the pgrp; the command name (field 2) may hold spaces, so split after ')'.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(pid)
    return members


def _kill_group(pgid: int, sig: int) -> None:
    for pid in group_members(pgid):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _sweep_group(pgid: int, timeout_s: float = 30.0) -> None:
    """SIGKILL whatever is left in the group (the server, the engine-core workers it started) until
    nothing is: a process forked after one sweep read /proc (a server starting its workers as it is
    stopped) would otherwise outlive the guard, and nothing would stop it then."""
    deadline = time.monotonic() + timeout_s
    while group_members(pgid) and time.monotonic() < deadline:
        _kill_group(pgid, signal.SIGKILL)
        time.sleep(0.02)


# The engine runs a little below the tuner's CPU priority: where client and engine share a machine
# (a CPU host, or a GPU host whose engine keeps its cores busy), the replay client must never be the
# one that waits for a core, or a load level would measure the client. On an idle machine the
# engine runs at full speed all the same. TRACETUNE_ENGINE_NICE=0 turns this off.
ENGINE_NICENESS = 5


def _server_preexec() -> None:
    _set_parent_death_signal(signal.SIGKILL)
    try:
        os.nice(int(os.environ.get("TRACETUNE_ENGINE_NICE", ENGINE_NICENESS)))
    except (OSError, ValueError):
        pass


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m tracetune.engine_adapter._guard -- CMD ARGS...", file=sys.stderr)
        return 2
    _set_parent_death_signal(signal.SIGTERM)
    pgid = os.getpgrp()
    # A plain flag, polled: a signal handler that calls Event.set() while the main thread sits in
    # Event.wait() can deadlock on the event's own lock (seen: the tuner killed by SIGTERM, the
    # parent-death SIGTERM caught mid-wait, the guard hung and its engine outlived the tuner).
    stopping = [False]

    def request_stop(*_args: object) -> None:
        stopping[0] = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    # The server gets SIGKILL if this guard dies, even by SIGKILL (nothing else would stop it then).
    # No thread runs yet, so a preexec function is safe here.
    server = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=_server_preexec)

    def watch_parent() -> None:
        # Blocks until the tuner closes its end of the pipe or dies.
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        stopping[0] = True

    threading.Thread(target=watch_parent, daemon=True).start()

    while server.poll() is None and not stopping[0]:
        time.sleep(0.2)

    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    _sweep_group(pgid)
    code = server.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
