"""Who used this machine's cores over a span (`replay.machine`): the rule that calls a span busy, on
spans given, and the accounting itself against real processes burning a core."""

from __future__ import annotations

import subprocess
import sys
import time

from tracetune.replay import machine
from tracetune.replay.machine import Share, Snapshot, busy_reason, share

BURN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass"


def span(cpus: int, *, engine: float = 0.0, client: float = 0.0, others: float = 0.0) -> Share:
    idle = max(cpus - engine - client - others, 0.0)
    return Share(seconds=10.0, cpus=cpus, engine=engine, client=client, others=others, steal=0.0, idle=idle)


def test_other_work_on_the_engines_cores_is_busy_and_spare_cores_are_not():
    # Two cores, a CPU engine that needs both: a program burning one core took half of them.
    reason = busy_reason(span(2, engine=0.8, client=0.2, others=1.0), engine_cores=2)
    assert reason.startswith("machine busy: other work took 1.0 of the 2 cores the engine needs")
    assert "engine 0.8, client 0.2, others 1.0, idle 0.0 of 2 cores" in reason
    # Background noise (kernel threads, a shell) under a fifth of the engine's cores: quiet.
    assert busy_reason(span(2, engine=1.5, client=0.2, others=0.3), engine_cores=2) == ""
    # A GPU host: the engine needs 2 of 16 cores; another program's core leaves it all it needs.
    assert busy_reason(span(16, engine=1.2, client=0.5, others=1.0), engine_cores=2) == ""
    # ... unless the others fill the host.
    assert busy_reason(span(16, engine=1.0, client=0.5, others=14.0), engine_cores=2)


def test_a_span_reads_cores_from_two_snapshots_and_steal_is_other_work():
    before = Snapshot(at=0.0, processes=100.0, idle=50.0, steal=1.0, engine=40.0, client=10.0)
    after = Snapshot(at=10.0, processes=117.0, idle=52.0, steal=2.0, engine=50.0, client=12.0)
    got = share(before, after)
    assert got is not None
    assert (got.engine, got.client, got.steal, got.idle) == (1.0, 0.2, 0.1, 0.2)
    assert abs(got.others - 0.6) < 1e-9  # 1.7 cores of processes less the engine's and the client's, plus steal
    assert share(before, Snapshot(at=0.5, processes=100.0, idle=50.0, steal=1.0, engine=40.0, client=10.0)) is None


def test_real_processes_are_told_apart_engine_client_and_others():
    """A core burned in the engine's process group is the engine's; one burned by a program outside this
    process's tree (started detached, as another user's would be) is other work."""
    engine = subprocess.Popen([sys.executable, "-c", BURN.format(s=4)], start_new_session=True)
    other = subprocess.Popen(["setsid", "-f", sys.executable, "-c", BURN.format(s=4)])
    other.wait()  # setsid -f returns at once: the burner's parent is gone, it is no descendant of ours
    try:
        watch = machine.Watch(engine.pid, engine_cores=2)
        time.sleep(0.3)
        watch.start()
        time.sleep(2.0)
        got = watch.stop()
    finally:
        engine.kill()
        engine.wait()
    assert got is not None
    # A core each wanted; a machine running other things too gives them less, never none.
    assert got.engine > 0.25 and got.others > 0.25 and got.client < 0.2, got.text()
    assert abs(got.engine + got.client + got.others + got.idle - got.cpus) < 0.35, got.text()  # every core accounted
