"""ServerProcess lifecycle on a stand-in server: healthy, early exit, never healthy, stubborn,
and a parent killed with SIGKILL. The same guarantees are checked on real vLLM in
tests/integration."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tracetune.engine_adapter.process import ServerProcess, free_port, group_alive
from tracetune.errors import EngineStartError, EngineTimeoutError

FAKE = str(Path(__file__).parent / "fake_server.py")
ROOT = str(Path(__file__).resolve().parents[2])


def make(tmp_path, mode):
    port = free_port()
    return ServerProcess([sys.executable, FAKE, str(port), mode], env=dict(os.environ),
                         log_path=tmp_path / "server.log", health_url=f"http://127.0.0.1:{port}/health")


def wait_gone(pgid, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not group_alive(pgid)


def test_start_healthy_stop_leaves_no_process(tmp_path):
    proc = make(tmp_path, "healthy")
    proc.start()
    proc.wait_healthy(20, poll_s=0.05)
    pgid = proc.pid
    assert group_alive(pgid)
    proc.stop()
    assert not group_alive(pgid)  # the grandchild `sleep` went too
    assert proc.stop() is not None  # idempotent


def test_exit_before_healthy_carries_code_and_log(tmp_path):
    proc = make(tmp_path, "exit3")
    proc.start()
    with pytest.raises(EngineStartError) as info:
        proc.wait_healthy(20, poll_s=0.05)
    assert info.value.engine_exit_code == 3
    assert "boom: bad flag --frobnicate" in info.value.log_tail
    assert not group_alive(proc.pid)


def test_never_healthy_times_out_and_is_stopped(tmp_path):
    proc = make(tmp_path, "never")
    proc.start()
    with pytest.raises(EngineTimeoutError, match="did not become healthy within 1s"):
        proc.wait_healthy(1.0, poll_s=0.05)
    assert "fake server starting" in str(proc.log_tail())
    assert not group_alive(proc.pid)


def test_server_ignoring_sigterm_is_killed(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACETUNE_ENGINE_STOP_GRACE_S", "1")
    proc = make(tmp_path, "stubborn")
    proc.env = dict(os.environ)
    proc.start()
    proc.wait_healthy(20, poll_s=0.05)
    t0 = time.monotonic()
    proc.stop(grace_s=2.0)
    assert not group_alive(proc.pid)
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("sig,mode", [(signal.SIGKILL, "healthy"), (signal.SIGTERM, "healthy"),
                                      (signal.SIGINT, "healthy"), (signal.SIGKILL, "spawning")])
def test_group_dies_with_its_parent(tmp_path, sig, mode, monkeypatch):
    """`spawning`: the server keeps starting processes while the guard stops it (vLLM starting its
    engine core when the tuner dies); the guard sweeps its group until nothing is left."""
    monkeypatch.setenv("TRACETUNE_ENGINE_STOP_GRACE_S", "1")
    parent_code = textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        from tracetune.engine_adapter.process import ServerProcess, free_port
        port = free_port()
        p = ServerProcess([sys.executable, {FAKE!r}, str(port), {mode!r}], env=dict(os.environ),
                          log_path=Path({str(tmp_path)!r}) / "s.log", health_url=f"http://127.0.0.1:{{port}}/health")
        p.start()
        p.wait_healthy(20, poll_s=0.05)
        print(p.pid, flush=True)
        time.sleep(300)
    """)
    # SIGINT back to its default in the child: a background job of a non-interactive shell inherits
    # it ignored, and then SIGINT would not end the parent at all.
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    pgid = int(parent.stdout.readline())
    assert group_alive(pgid)
    parent.send_signal(sig)
    parent.wait(timeout=20)
    gone = wait_gone(pgid)
    if not gone:
        os.killpg(pgid, signal.SIGKILL)
    assert gone, "server process group outlived its parent"


def test_root_cause_skips_wrapper_errors():
    from tracetune.engine_adapter.process import root_cause

    log = "\n".join([
        "(APIServer pid=1) WARNING [x.py:1] failed with error ... `OSError: [Errno 24] Too many open files`.",
        "(EngineCore pid=2) ERROR 11-29 09:23:48 [core.py:1510] ValueError: No available memory for the cache blocks.",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    ])
    assert root_cause(log) == "ValueError: No available memory for the cache blocks."
    assert root_cause("all good\nINFO started") is None


@pytest.mark.slow  # waits out the server's orphan check (about 15 s)
def test_server_dies_even_if_its_watchdog_is_sigkilled(tmp_path):
    """The guard gives the server a parent-death SIGKILL: a guard killed outright (which can
    clean up nothing) still takes the server down with it."""
    proc = make(tmp_path, "healthy")
    proc.start()
    proc.wait_healthy(20, poll_s=0.05)
    guard = proc.pid
    children = Path(f"/proc/{guard}/task/{guard}/children").read_text().split()
    assert children, "the guard has no server child"
    server = int(children[0])
    os.kill(guard, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{server}").exists() and time.monotonic() < deadline:
        stat = Path(f"/proc/{server}/stat").read_text() if Path(f"/proc/{server}").exists() else ""
        if stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]:
            break  # a zombie is dead, only not yet reaped
        time.sleep(0.05)
    alive = Path(f"/proc/{server}").exists() and \
        Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[-1].split()[:1] != ["Z"]
    proc.stop()
    assert not alive, "the server outlived its SIGKILLed watchdog"
