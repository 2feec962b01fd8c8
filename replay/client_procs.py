"""One replay spread over several client processes that share one schedule.

A single Python process sends a few thousand streamed requests per second at most
(benchmarks/harness_ceiling.py measures it); a small model on a large GPU serves more. With
`--client-procs N` the measured requests are dealt round-robin to N worker processes, which all
start the schedule at the same instant (the monotonic clock is one clock for every process on a
Linux host), and their records are merged back, each request exactly once, ordered by trace index.
Workers report what finished and what is in flight every 50 ms, so a `stop_when` (a capacity
level's early abandon) sees the whole replay and stops every worker at once.

Workers are started with the `spawn` method: they inherit no file descriptor from the tuner (an
engine's watchdog pipe in particular, whose end must close when the tuner dies).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import multiprocessing
import multiprocessing.connection
import multiprocessing.process
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from tracetune.replay.replayer import Replayer, loop_runner, quiet_gc
from tracetune.replay.types import InFlight, PreparedRequest, ReplayOptions, RequestRecord, StopWhen

# Requests per second one client process offers on one core with its schedule lag p99 well under the
# bound (measured with benchmarks/harness_ceiling.py, 32 output tokens a request; see README): the
# automatic --client-procs gives every this-many requests per second of peak rate one more process.
RATE_PER_PROCESS = 2000.0
REPORT_EVERY_S = 0.05
START_MARGIN_S = 0.05  # from the parent's "go" to the shared start: every worker has its message
STOP_DRAIN_S = 2.0  # after an interrupt: how long the workers' last reports are waited for


def cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def peak_rate(requests: Sequence[PreparedRequest], window_s: float = 1.0) -> float:
    """The most requests scheduled in any `window_s` window, per second."""
    times = np.sort(np.asarray([r.scheduled_s for r in requests], dtype=float))
    if times.size < 2:
        return float(times.size) / window_s
    ends = np.searchsorted(times, times + window_s, side="left")
    return float((ends - np.arange(times.size)).max()) / window_s


def engine_cores(platform: str, gpus: int) -> int:
    """Cores an engine this tool starts keeps busy: all of them on the CPU; its API server and one
    engine process per GPU on a GPU host. The client processes get the rest."""
    return cores() if platform == "cpu" else 1 + gpus


def more_client_procs(procs: int, engine_cores: int) -> int:
    """For a replay the client could not keep up with: twice the processes, within the cores the
    engine leaves (not more than `procs` when there are none to add)."""
    return min(2 * procs, cores() - engine_cores)


def auto_client_procs(requests: Sequence[PreparedRequest], engine_cores: int) -> int:
    """Client processes for a replay: enough for its peak rate, within the cores the engine leaves."""
    needed = math.ceil(peak_rate(requests) / RATE_PER_PROCESS)
    return max(1, min(needed, cores() - engine_cores))


class ClientPool:
    """N spawned client processes, reusable across replays (the levels of a capacity search)."""

    def __init__(self, procs: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conns: list[multiprocessing.connection.Connection] = []
        self.procs: list[multiprocessing.process.BaseProcess] = []
        for _ in range(procs):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(child,), daemon=True, name="tracetune-client")
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)

    def __len__(self) -> int:
        return len(self.conns)

    def __enter__(self) -> ClientPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(("exit",))
            except (OSError, ValueError):
                pass
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
        self.conns, self.procs = [], []

    def run(self, base_url: str, model: str, measured: Sequence[PreparedRequest], options: ReplayOptions, *,
            headers: dict[str, str] | None, stop_when: StopWhen | None = None,
            on_progress: Callable[[int, int, int], None] | None = None,
            on_record: Callable[[RequestRecord], None] | None = None,
            clock: Callable[[], float] = time.perf_counter) -> PoolRun:
        """Replay `measured` (warm-up already done) across the pool; `on_record` sees each record as
        its worker reports it. Interrupted (Ctrl-C, SIGTERM), every worker is told to stop and what
        they finished is still handed to `on_record` before the interrupt goes on."""
        n = len(self.conns)
        t_first = measured[0].scheduled_s
        for i, conn in enumerate(self.conns):
            conn.send(("run", base_url, model, list(measured[i::n]), options, headers, t_first))
        for i, conn in enumerate(self.conns):  # each has encoded its requests' bodies
            _receive(conn, i)
        start = clock() + START_MARGIN_S
        for conn in self.conns:
            conn.send(("go", start))
        run = _Collect(n, on_record)
        stopped = False
        try:
            while run.pending:
                run.take(self.conns, REPORT_EVERY_S)
                if on_progress:
                    on_progress(len(run.finished), len(measured), run.live())
                if stop_when and not stopped and run.pending and \
                        stop_when(run.finished, run.in_flight_now(), clock()):
                    stopped = True
                    self._stop(run.pending)
        except BaseException:
            self._stop(run.pending)
            run.drain(self.conns, deadline=time.monotonic() + STOP_DRAIN_S)
            raise
        return PoolRun(sorted(run.finished, key=lambda r: r.index), clock() - start, sum(run.sent), stopped, run.waits)

    def _stop(self, workers: set[int]) -> None:
        for i in workers:
            try:
                self.conns[i].send(("stop",))
            except (OSError, ValueError):  # that worker is gone already
                pass


class _Collect:
    """What the workers of one run reported: records finished, requests in flight and sent, per worker."""

    def __init__(self, n: int, on_record: Callable[[RequestRecord], None] | None) -> None:
        self.finished: list[RequestRecord] = []
        self.in_flight: dict[int, list[InFlight]] = {}
        self.sent = [0] * n
        self.waits = 0
        self.pending = set(range(n))
        self.on_record = on_record

    def take(self, conns: list[multiprocessing.connection.Connection], timeout_s: float) -> None:
        """Read every report that arrives within `timeout_s`."""
        ready = multiprocessing.connection.wait([conns[i] for i in self.pending], timeout=timeout_s)
        for conn in ready:
            assert isinstance(conn, multiprocessing.connection.Connection)  # wait() was given only these
            i = conns.index(conn)
            kind, records, live, count, conn_waits = _receive(conn, i)
            self.finished += records
            self.in_flight[i], self.sent[i] = live, count
            if self.on_record is not None:
                for record in records:
                    self.on_record(record)
            if kind == "done":
                self.pending.discard(i)
                self.in_flight[i] = []
                self.waits += conn_waits

    def drain(self, conns: list[multiprocessing.connection.Connection], deadline: float) -> None:
        """After a stop: the workers' last reports, until each is done or `deadline` (monotonic) passes."""
        while self.pending and time.monotonic() < deadline:
            try:
                self.take(conns, REPORT_EVERY_S)
            except Exception:  # a worker died on the way out (or its pipe broke): keep what was reported
                return

    def live(self) -> int:
        return sum(len(v) for v in self.in_flight.values())

    def in_flight_now(self) -> list[InFlight]:
        return [x for v in self.in_flight.values() for x in v]


@dataclasses.dataclass
class PoolRun:
    records: list[RequestRecord]  # merged, each request once, by trace index
    duration_s: float
    sent: int
    abandoned: bool  # `stop_when` ended it
    connection_waits: int


Report = tuple[str, list[RequestRecord], list[InFlight], int, int]  # kind, records, in flight, sent, waits


def _receive(conn: multiprocessing.connection.Connection, i: int) -> Report:
    try:
        message = conn.recv()
    except EOFError:
        raise RuntimeError(f"client process {i} died during the replay (see its output above)") from None
    if message[0] == "error":
        raise RuntimeError(f"client process {i} failed: {message[1]}")
    report: Report = message
    return report


def _worker_main(conn: multiprocessing.connection.Connection) -> None:
    """A client process: run each replay it is sent, reporting progress, until told to exit. Ctrl-C
    reaches the whole process group: the parent decides (it stops the workers and keeps their
    records), so a worker ignores SIGINT rather than die with a traceback mid-report."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    run_loop = loop_runner()
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the tuner is gone
            return
        if message[0] == "exit":
            return
        if message[0] != "run":
            continue
        try:
            with quiet_gc():
                run_loop(_serve(conn, *message[1:]))
        except Exception as exc:  # reported, not raised: the parent names the process
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


async def _serve(conn: multiprocessing.connection.Connection, base_url: str, model: str,
                 requests: list[PreparedRequest], options: ReplayOptions, headers: dict[str, str] | None,
                 t_first: float) -> None:
    from tracetune.engine_adapter.openai_client import new_session

    replayer = Replayer(base_url, model, options, headers=headers)
    bodies = replayer.bodies(requests)
    conn.send(("ready", [], [], 0, 0))
    start = conn.recv()[1]
    loop = asyncio.get_running_loop()
    stop = threading.Event()
    running = threading.Event()
    running.set()

    def listen() -> None:
        # A thread waits for the parent's "stop" (the pipe stays blocking, as multiprocessing needs:
        # an event loop's reader would make it non-blocking); this one only reads, the loop only writes.
        while running.is_set():
            try:
                if conn.poll(REPORT_EVERY_S) and conn.recv()[0] == "stop":
                    stop.set()
                    return
            except (EOFError, OSError):
                stop.set()
                return

    waits = reported = 0

    def report(kind: str) -> None:
        nonlocal reported
        fresh = replayer.finished[reported:]
        reported += len(fresh)
        conn.send((kind, fresh, list(replayer.live.values()), replayer.sent, waits))

    async def reporter() -> None:
        while True:
            await asyncio.sleep(REPORT_EVERY_S)
            report("progress")

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    task = loop.create_task(reporter())
    try:
        if requests:
            async with new_session() as session:
                await replayer.open_loop(session, requests, bodies, start, lambda *_: stop.is_set(), t_first=t_first)
                waits = session.waits
    finally:
        task.cancel()
        running.clear()
        listener.join()
    report("done")
