"""Whether a replay measured the engine or the machine: who used this machine's CPU while it ran.

A replay's latencies are the engine's only while the engine had the cores it runs on. Another
program on the same machine (a build, a test run, a neighbour's container, a hypervisor's other
guests) takes cores from the engine and its numbers collapse with no fault of its configuration.
This module accounts the machine's CPU time over a span, from Linux's /proc:

- the machine: /proc/stat's user, nice and system time of all CPUs (processes' time; interrupts
  are left out: the replay's own loopback traffic is served there), idle (with I/O wait) and
  steal (time a hypervisor gave to other guests while this machine's CPUs were runnable);
- the engine: every process of its server's process group (tracetune starts each server in a
  session of its own, `engine_adapter.process.ServerProcess`): utime + stime of /proc/PID/stat;
- the client: this process and its descendants outside the engine's group (the client processes);
- others: the machine's process time less the engine's and the client's (other programs,
  kernel threads), plus steal.

Each is an average number of cores over the span (`Share`). The rule that calls a span busy
(`busy_reason`) is stated in docs/capacity.md ("A machine busy with other work"). Off Linux
(no /proc), nothing is accounted and no span is called busy.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Annotated

from tracetune.stored import Record, rounded

PROC = Path("/proc")
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01

# A span is busy when other work took at least this share of the cores the engine needs, and the cores
# it left were fewer than the engine needs and the client used (the others did not just use spare cores).
BUSY_SHARE = 0.2
QUIET_SPAN_S = 5.0  # a quiet machine: one span this long that is not busy (the engine idle)
QUIET_WAIT_S = 120.0  # the longest wait for one


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """CPU seconds used since boot (all CPUs summed), read at `at` (monotonic seconds)."""

    at: float
    processes: float  # user + nice + system of every CPU
    idle: float  # idle + iowait
    steal: float
    engine: float  # the engine's process group
    client: float  # this process and its descendants outside the engine's group


Thousandths = Annotated[float, rounded(3)]  # a number as a share stores it: to a thousandth


@dataclasses.dataclass(frozen=True)
class Share(Record[dict[str, float]]):
    """Average cores used over a span of `seconds` on a machine of `cpus` CPUs (stored in `Step.machine`)."""

    seconds: Thousandths
    cpus: int
    engine: Thousandths
    client: Thousandths
    others: Thousandths  # other processes and steal
    steal: Thousandths
    idle: Thousandths

    def text(self) -> str:
        """The span's cores in one phrase: "engine 1.6, client 0.2, others 1.1 (steal 0.1), idle 0.0 of 2"."""
        steal = f" (steal {self.steal:.1f})" if self.steal >= 0.05 else ""
        return (f"engine {self.engine:.1f}, client {self.client:.1f}, others {self.others:.1f}{steal}, "
                f"idle {self.idle:.1f} of {self.cpus} cores")


def _stat_fields(pid: str) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state is [0], ppid [1], pgrp [2], utime [11],
    stime [12]); None when the process is gone."""
    try:
        raw = (PROC / pid / "stat").read_bytes()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2:].decode().split()


def _processes() -> dict[int, tuple[int, int, float]]:
    """Every process now: pid -> (parent pid, process group, CPU seconds used)."""
    out: dict[int, tuple[int, int, float]] = {}
    for entry in os.listdir(PROC):
        if not entry.isdigit():
            continue
        fields = _stat_fields(entry)
        if fields is None or len(fields) < 13:
            continue
        out[int(entry)] = (int(fields[1]), int(fields[2]), (int(fields[11]) + int(fields[12])) * TICK_S)
    return out


def _own(processes: dict[int, tuple[int, int, float]], engine_group: int | None) -> float:
    """CPU seconds of this process and its descendants, the engine's group left out."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in processes.items():
        children.setdefault(parent, []).append(pid)
    total, stack = 0.0, [os.getpid()]
    while stack:
        pid = stack.pop()
        row = processes.get(pid)
        if row is None or (engine_group is not None and row[1] == engine_group):
            continue
        total += row[2]
        stack.extend(children.get(pid, ()))
    return total


def snapshot(engine_group: int | None) -> Snapshot | None:
    """The machine's CPU time now, with the engine's (its process group `engine_group`; None: no
    process of ours serves it) and the client's; None where /proc cannot be read."""
    try:
        cpu = (PROC / "stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if cpu[0] != "cpu" or len(cpu) < 9:
        return None
    user, nice, system, idle, iowait, _irq, _softirq, steal = (int(v) * TICK_S for v in cpu[1:9])
    processes = _processes()
    engine = 0.0 if engine_group is None else sum(t for _, group, t in processes.values() if group == engine_group)
    return Snapshot(at=time.monotonic(), processes=user + nice + system, idle=idle + iowait, steal=steal,
                    engine=engine, client=_own(processes, engine_group))


def share(before: Snapshot, after: Snapshot) -> Share | None:
    """Cores used between two snapshots; None for a span too short to read (under a second)."""
    seconds = after.at - before.at
    if seconds < 1.0:
        return None

    def cores(field: str) -> float:
        return max(getattr(after, field) - getattr(before, field), 0.0) / seconds

    engine, client, steal = cores("engine"), cores("client"), cores("steal")
    others = max(cores("processes") - engine - client, 0.0) + steal
    return Share(seconds=seconds, cpus=os.cpu_count() or 1, engine=engine, client=client, others=others,
                 steal=steal, idle=cores("idle"))


def busy_reason(span: Share, engine_cores: int) -> str:
    """Why the span measured the machine rather than the engine ("" when it did not): other work took
    at least `BUSY_SHARE` of the `engine_cores` the engine needs, and the cores it left were fewer
    than the engine needs plus what the client used."""
    need = max(min(engine_cores, span.cpus), 1)
    if span.others < BUSY_SHARE * need or span.cpus - span.others >= need + span.client:
        return ""
    return (f"machine busy: other work took {span.others:.1f} of the {need} cores the engine needs "
            f"({span.text()})")


class Watch:
    """Accounts one span after another for an engine (its process group; None: not ours)."""

    def __init__(self, engine_group: int | None, engine_cores: int, *, quiet_span_s: float = QUIET_SPAN_S,
                 quiet_limit_s: float = QUIET_WAIT_S) -> None:
        self.engine_group, self.engine_cores = engine_group, engine_cores
        self.quiet_span_s, self.quiet_limit_s = quiet_span_s, quiet_limit_s
        self._start: Snapshot | None = None

    def start(self) -> None:
        self._start = snapshot(self.engine_group)

    def stop(self) -> Share | None:
        """The span since `start` (None: not started, unreadable or under a second)."""
        before, self._start = self._start, None
        after = snapshot(self.engine_group)
        return None if before is None or after is None else share(before, after)

    def wait_quiet(self) -> float:
        """Wait, span after span of `quiet_span_s`, until one is not busy or `quiet_limit_s` passed;
        the seconds waited."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.quiet_limit_s:
            self.start()
            time.sleep(self.quiet_span_s)
            span = self.stop()
            if span is None or not busy_reason(span, self.engine_cores):
                break
        return time.monotonic() - t0
