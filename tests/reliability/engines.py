"""Helpers for the reliability tests that run `tune` on real vLLM: start the tuner as a
subprocess, find the engine processes it started (tagged through --engine-env), wait for
conditions."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "examples" / "traffic.jsonl"
FAST = ["--max-requests", "6", "--warmup", "1", "--probe-prompts", "4", "--probe-tokens", "16"]
# Kills and faults test a study's lifecycle, not its quality: no probe, whose reference alone takes about
# a minute on llama-server on 2 cores (one request per scored position; the mini study tests quality).
NO_QUALITY = ["--objectives", "ttft_p99,output_tps", "--max-quality-loss", "none"]


def new_tag() -> str:
    return "tt-" + uuid.uuid4().hex[:12]


def tagged(tag: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose environment carries TRACETUNE_TEST_TAG=tag."""
    needle = f"TRACETUNE_TEST_TAG={tag}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[-1].split()[0] == b"Z":
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out.append((int(entry), cmd))
    return out


def engines(tag: str) -> list[tuple[int, str]]:
    """The tagged vLLM processes (API server and engine core), the guard excluded."""
    return [(pid, cmd) for pid, cmd in tagged(tag) if "tracetune.engine_adapter._guard" not in cmd]


def _stat(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after the command name: state, ppid, pgrp, ... ([] if gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].decode().split()
    except OSError:
        return []


def engines_of(tag: str, tuner_pid: int, needle: str = "") -> list[tuple[int, str]]:
    """The tagged engine processes that the tuner `tuner_pid` started (their guard, the leader of
    their process group, is its child), optionally only those whose command line holds `needle`."""
    out = []
    for pid, cmd in engines(tag):
        fields = _stat(pid)
        leader = _stat(int(fields[2])) if len(fields) > 2 else []
        if len(leader) > 1 and int(leader[1]) == tuner_pid and needle in cmd:
            out.append((pid, cmd))
    return out


def describe(tag: str) -> str:
    """One line per live tagged process (pid, state, parent, group, command), for failure messages."""
    lines = []
    for pid, cmd in tagged(tag):
        fields = _stat(pid)
        if len(fields) > 2:
            lines.append(f"pid {pid} state {fields[0]} ppid {fields[1]} pgrp {fields[2]}: {cmd[:160]}")
    return "\n".join(lines)


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def gone_within(tag: str, timeout_s: float) -> float | None:
    """Seconds until no tagged process is left, or None if some outlived `timeout_s`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if not tagged(tag):
            return time.monotonic() - t0
        time.sleep(0.2)
    return None


def kill_tagged(tag: str) -> None:
    for pid, _ in tagged(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def engine_port(cmd: str) -> int | None:
    m = re.search(r"--port (\d+)", cmd)
    return int(m.group(1)) if m else None


def sigint_default() -> None:
    """In the child before exec: SIGINT back to its default. A test run from a non-interactive
    shell's background job inherits SIGINT ignored, and Python keeps it ignored, so Ctrl-C tests
    would test nothing (measured: CI started with `nohup ... &` timed out on every SIGINT case)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Tune:
    """`tune --trace ...` in a subprocess, its output in a file."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._f = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "tracetune", *args], cwd=ROOT, stdout=self._f,
                                     stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "200", **(env or {})},
                                     preexec_fn=sigint_default)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        finally:
            self._f.flush()

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)


def run_tune(args: list[str], log: Path, timeout_s: float = 900, env: dict[str, str] | None = None):
    t = Tune(args, log, env)
    try:
        code = t.wait(timeout_s)
    except subprocess.TimeoutExpired:
        t.proc.kill()
        t.proc.wait()
        raise AssertionError(f"tune did not finish within {timeout_s}s:\n{t.output()[-3000:]}") from None
    return code, t.output()
