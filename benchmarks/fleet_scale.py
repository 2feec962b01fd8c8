"""One study over 1, 4 and 16 workers on this machine: trials per hour, the database's load, no
configuration measured twice, and workers SIGKILLed mid-trial losing nothing.

    .venv/bin/python benchmarks/fleet_scale.py [--workers 1,4,16] [--trials 6,16,48] [--kill 4]
                                               [--heartbeat 4] [--json OUT]

Starts its own PostgreSQL server (benchmarks/pg_server.py, with pg_stat_statements), one fresh
database per run, and runs the study as a fleet runs it: N plain `tune --engine sim` processes on
one --study and --storage, each with its own --engine-port and --run-dir (benchmarks/fleet_workers.py
has the command: short trials, 192 configurations). In the last run, `--kill` workers are SIGKILLed
while each measures a trial (its trial RUNNING, its claim held), once a quarter of the budget is
finished; the others must finish the study.

Printed side by side, per run: counted trials over wall time (trials per hour, against one
worker), the same after the reference (first trial start to last trial end), the database's
queries per second (pg_stat_statements, without BEGIN/COMMIT; the benchmark's own reads excluded),
transactions per second, peak connections, deadlocks and busiest tables (pg_stat_user_tables:
scans, rows read, rows written), CPU used (the whole machine, the workers with their engines and
replay clients, PostgreSQL) and a trial's mean wall time, the configurations measured against
distinct ones and the claims, and for the kills: finished trials still COMPLETE with their
values, killed trials re-queued and measured again, trials left RUNNING. About 6 minutes on 2
cores with the defaults. `--max-connections` sets the server's limit (a worker keeps 3, 4 at peak;
one refused says so and exits 1, the others go on).

The engine is simulated (engine_adapter/sim: a local server whose latency is a queueing model):
this measures the study's coordination and its database, not an engine's or a GPU's throughput.
On a small machine every worker's engine and replay client share its cores: where the CPU is
full, more workers cannot add trials per hour, whatever the database does.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from fleet_workers import Kills, engine_starts, kill_mid_trial, outcome, start_workers, wait_all
from pg_server import postgres_server, postmaster_pid

from tracetune.tuner.storage import COUNTED

COUNTED_STATUSES = {str(s) for s in COUNTED}
OBSERVER = "fleet_observer"  # the role this benchmark reads the study with: its own queries are not counted


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def children_cpu_s() -> float:
    """CPU seconds of this process's waited-for children (the workers, their engines and clients)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def postgres_cpu_s(pid: int | None) -> float:
    """CPU seconds of the PostgreSQL server: its main process, the backends it reaped, its live ones."""
    if pid is None:
        return float("nan")
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if int(entry) == pid:
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        elif int(fields[1]) == pid:
            total += int(fields[11]) + int(fields[12])
    return total / tick


class CpuMeter:
    """CPU used between `__init__` and `stop`, in cores: the machine, our workers, PostgreSQL."""

    def __init__(self, pg_pid: int | None) -> None:
        self.pg_pid = pg_pid
        self.t0 = time.monotonic()
        self.machine0, self.children0, self.pg0 = machine_jiffies(), children_cpu_s(), postgres_cpu_s(pg_pid)

    def stop(self) -> dict[str, float]:
        wall = time.monotonic() - self.t0
        busy, total = machine_jiffies()
        share = (busy - self.machine0[0]) / max(total - self.machine0[1], 1)
        return {"machine": share * (os.cpu_count() or 1), "workers": (children_cpu_s() - self.children0) / wall,
                "postgres": (postgres_cpu_s(self.pg_pid) - self.pg0) / wall}


def admin(url: str) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=True)


def prepare_server(url: str) -> None:
    """The statement statistics and the benchmark's own reading role."""
    with admin(url) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute(f"CREATE ROLE {OBSERVER} LOGIN SUPERUSER")


def new_database(url: str, name: str) -> tuple[str, str]:
    """(workers' URL, observer's URL) of a fresh database `name` on the server at `url`."""
    with admin(url) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    base = url.rsplit("/", 1)[0] + f"/{name}"
    return base, base.replace("postgresql://postgres@", f"postgresql://{OBSERVER}@", 1)


_CONTROL = {"", "BEGIN", "COMMIT", "ROLLBACK", "DEALLOCATE", "SAVEPOINT", "RELEASE"}  # not queries


def statements(url: str, db: str) -> dict[str, Any]:
    """Queries run in `db` since the last reset (transaction control and the observer's excluded):
    calls, rows, the 3 most called; and the database's transactions and deadlocks."""
    with admin(url) as conn:
        rows = conn.execute(
            "SELECT s.calls, s.rows, s.query FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
            "JOIN pg_roles r ON r.oid = s.userid WHERE d.datname = %s AND r.rolname <> %s ORDER BY s.calls DESC",
            (db, OBSERVER)).fetchall()
        xact = conn.execute("SELECT xact_commit + xact_rollback, deadlocks FROM pg_stat_database WHERE datname = %s",
                            (db,)).fetchone() or (0, 0)
    rows = [r for r in rows if r[2].strip().rstrip(";").split(" ")[0].upper() not in _CONTROL]
    return {"calls": sum(r[0] for r in rows), "rows": sum(r[1] for r in rows), "xact": xact[0],
            "deadlocks": xact[1], "top": [(r[0], " ".join(r[2].split())[:120]) for r in rows[:3]]}


def busiest_tables(db_url: str, n: int = 3) -> list[dict[str, Any]]:
    """The `n` tables with the most scans (sequential + index; then rows read) in the study's database."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT relname, seq_scan + coalesce(idx_scan, 0) AS scans, seq_tup_read + coalesce(idx_tup_fetch, 0) "
            "AS rows_read, n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables "
            "ORDER BY scans DESC, rows_read DESC LIMIT %s", (n,)).fetchall()
    return [{"name": r[0], "scans": r[1], "rows_read": r[2], "rows_written": r[3]} for r in rows]


class Connections:
    """Connections to database `db` every `every_s`, from a thread, on a connection of its own
    opened before the workers take theirs: the series (seconds, count) and its peak."""

    def __init__(self, url: str, db: str, every_s: float = 0.5) -> None:
        self.conn, self.db, self.every_s = admin(url), db, every_s
        self.series: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.wait(self.every_s):
            row = self.conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (self.db,)).fetchone()
            self.series.append((round(time.monotonic() - t0, 1), int(row[0]) if row else 0))

    @property
    def peak(self) -> int:
        return max((n for _, n in self.series), default=0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.conn.close()


def reset_statements(url: str) -> None:
    with admin(url) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def trial_window_s(db_url: str) -> float | None:
    """From the first trial's start to the last trial's end (the reference before it excluded)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("SELECT extract(epoch FROM max(datetime_complete) - min(datetime_start)) "
                           "FROM trials").fetchone()
    return float(row[0]) if row and row[0] is not None else None


def mean_trial_s(timeline: list[tuple]) -> float:
    """Mean wall time of the trials that measured (start to end), from the study's timeline."""
    import datetime as dt

    spans = [(dt.datetime.fromisoformat(end) - dt.datetime.fromisoformat(start)).total_seconds()
             for _, state, status, _, start, end, *_ in timeline if state == "COMPLETE" and status in COUNTED_STATUSES]
    return sum(spans) / len(spans) if spans else float("nan")


def run(url: str, pg_pid: int | None, n: int, trials: int, kill: int, args: argparse.Namespace) -> dict[str, Any]:
    """One study with `n` workers (SIGKILLing `kill` of them mid-trial), measured."""
    db = f"fleet_{n}_workers"
    db_url, observer_url = new_database(url, db)
    root = Path(tempfile.mkdtemp(prefix=f"fleet-{n}-", dir=args.work_dir))
    reset_statements(url)
    before = statements(url, db)
    print(f"  {n} worker(s), {trials} trials: running ...", file=sys.stderr)
    meter, t0 = CpuMeter(pg_pid), time.monotonic()
    workers = start_workers(n, db_url, root, trials=trials, heartbeat_s=args.heartbeat)
    kills, conns = Kills(), Connections(url, db)
    try:
        if kill:
            kills = kill_mid_trial(observer_url, workers, kill, min_finished=max(trials // 4, 1),
                                   timeout_s=args.run_timeout)
            print(f"  SIGKILLed {len(kills.trials)} workers measuring trials {sorted(kills.trials)} after "
                  f"{kills.at_s - t0:.0f} s", file=sys.stderr)
    finally:
        finished = wait_all(workers, max(args.run_timeout - (time.monotonic() - t0), 1))
        wall, cpu = time.monotonic() - t0, meter.stop()
        conns.stop()
    time.sleep(1.5)  # backends flush their statistics when they end
    after = statements(url, db)
    result = {"workers": n, "budget": trials, "wall_s": wall, "finished_in_time": finished, "cpu": cpu,
              "peak_connections": conns.peak, "connections": conns.series,
              "killed_after_s": None if kills.at is None else round(kills.at_s - t0, 1),
              "window_s": trial_window_s(observer_url),
              "statements": after["calls"] - before["calls"], "rows": after["rows"] - before["rows"],
              "xact": after["xact"] - before["xact"] - kills.polls, "top_statements": after["top"],
              "deadlocks": after["deadlocks"] - before["deadlocks"],
              "busiest": busiest_tables(observer_url), "engine_starts": engine_starts(workers),
              "exit_codes": sorted(w.proc.returncode for w in workers if w.pid not in kills.trials.values()),
              "logs": str(root), **outcome(observer_url, kills if kill else None)}
    result["mean_trial_s"] = mean_trial_s(result["timeline"])
    print(f"  {n} worker(s): {result['counted']}/{trials} trials in {wall:.0f} s", file=sys.stderr)
    return result


def _cols(values: list[object]) -> str:
    return "".join(f"{v!s:>14}" for v in values)


def _line(label: str, values: list[object]) -> None:
    print(f"{label:<36}{_cols(values)}")


def _per_hour(r: dict[str, Any], seconds: float | None) -> float:
    return r["counted"] * 3600 / seconds if seconds else float("nan")


def print_table(results: list[dict[str, Any]]) -> None:
    """The runs side by side (80 columns)."""
    one = _per_hour(results[0], results[0]["wall_s"]) if results[0]["workers"] == 1 else None
    _line("", [f"{r['workers']} worker{'s' * (r['workers'] > 1)}" for r in results])
    _line("trials counted / budget", [f"{r['counted']}/{r['budget']}" for r in results])
    _line("wall time (s)", [f"{r['wall_s']:.0f}" for r in results])
    _line("trials per hour", [f"{_per_hour(r, r['wall_s']):.0f}" for r in results])
    if one:
        _line("  against one worker", [f"{_per_hour(r, r['wall_s']) / one:.2f}x" for r in results])
    _line("  after the reference", [f"{_per_hour(r, r['window_s']):.0f}" for r in results])
    _line("duplicates drawn (reused, free)", [r["duplicates"] for r in results])
    _line("database: queries/s", [f"{r['statements'] / r['wall_s']:.0f}" for r in results])
    _line("  transactions/s", [f"{r['xact'] / r['wall_s']:.0f}" for r in results])
    _line("  queries per trial", [f"{r['statements'] / max(r['counted'], 1):.0f}" for r in results])
    _line("  peak connections", [r["peak_connections"] for r in results])
    _line("  deadlocks", [r["deadlocks"] for r in results])
    _line("  busiest table (by scans)", [_short(r["busiest"][0]["name"]) if r["busiest"] else "-" for r in results])
    _line("    its scans/s", [f"{r['busiest'][0]['scans'] / r['wall_s']:.0f}" if r["busiest"] else "-"
                              for r in results])
    _line("CPU, cores of 2: whole machine", [f"{r['cpu']['machine']:.2f}" for r in results])
    _line("  workers (engines, clients incl.)", [f"{r['cpu']['workers']:.2f}" for r in results])
    _line("  PostgreSQL", [f"{r['cpu']['postgres']:.2f}" for r in results])
    _line("  other work on this machine", [f"{r['cpu']['machine'] - r['cpu']['workers'] - r['cpu']['postgres']:.2f}"
                                          for r in results])
    _line("mean trial wall time (s)", [f"{r['mean_trial_s']:.1f}" for r in results])
    _line("worker CPU-seconds per trial", [f"{r['cpu']['workers'] * r['wall_s'] / max(r['counted'], 1):.1f}"
                                           for r in results])
    _line("trials unmeasurable (client late)", [r["statuses"].get("unmeasurable", 0) for r in results])
    _line("configs measured / distinct", [f"{r['measured']}/{r['distinct_configs']}" for r in results])
    _line("results of trials killed after", [len(r["unfinished_results"]) for r in results])
    _line("  storing them, measured again", [len(r["measured_again"]) for r in results])
    _line("  a result stored to its trial", [f"{_median(r['stored_to_finished_s']):.2f}" for r in results])
    _line("  COMPLETE, median (max) s", [f"({max(r['stored_to_finished_s'], default=float('nan')):.1f})"
                                         for r in results])
    _line("claims done / left running", [f"{r['claims_done']}/{r['claims_running']}" for r in results])
    _line("engine starts for trials", [r["engine_starts"] for r in results])
    _line("trials left RUNNING at the end", [r["states"].get("RUNNING", 0) for r in results])
    _line("surviving workers exit 0", [f"{r['exit_codes'].count(0)}/{len(r['exit_codes'])}" for r in results])
    _print_kills(results)
    _print_limit(results[-1])
    for r in results:
        statuses = ", ".join(f"{k} {v}" for k, v in r["statuses"].items())
        print(f"\n{r['workers']} worker(s): trials {statuses}\n  busiest tables{'scans/s':>26}"
              f"{'read/s':>10}{'written':>10}")
        for t in r["busiest"]:
            print(f"  {t['name']:<32}{t['scans'] / r['wall_s']:>8.1f}{t['rows_read'] / r['wall_s']:>10.1f}"
                  f"{t['rows_written']:>10}")
        print("  most called queries (calls)")
        for calls, query in r["top_statements"]:
            print(f"  {calls:>7} {query[:70]}")


def _print_kills(results: list[dict[str, Any]]) -> None:
    kills = [r.get("kills") for r in results]
    if not any(kills):
        return
    _line("SIGKILLed mid-trial", [len(k["killed_trials"]) if k else "-" for k in kills])
    _line("  finished before: still COMPLETE", [f"{k['finished_before'] - len(k['lost'])}/{k['finished_before']}"
                                                if k else "-" for k in kills])
    _line("  killed trials re-queued", [f"{len(k['requeued'])}/{len(k['killed_trials'])}" if k else "-"
                                        for k in kills])
    _line("  ... and measured again", [f"{k['retries_complete']}/{len(k['killed_trials'])}" if k else "-"
                                       for k in kills])
    _line("  failed at most (s) after the kill", [f"{max(k['requeued_after_s'], default=float('nan')):.1f}" if k
                                                  else "-" for k in kills])


def _print_limit(r: dict[str, Any]) -> None:
    """What bounded the largest run: the machine's cores, or the database."""
    cores = os.cpu_count() or 1
    busy, pg = r["cpu"]["machine"] / cores, r["cpu"]["postgres"]
    print(f"\nWith {r['workers']} workers the machine's {cores} cores were {busy:.0%} busy on average;\n"
          f"PostgreSQL used {pg:.2f} cores for {r['statements'] / r['wall_s']:.0f} queries/s.")
    if busy >= 0.9 and pg < 0.1 * cores:
        print("The CPU, not the database, bounds trials per hour here.")


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2] if values else float("nan")


def _short(name: str, width: int = 13) -> str:
    return name if len(name) <= width else name[:width - 1] + "~"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=_ints, default=[1, 4, 16], help="worker counts, one run each")
    p.add_argument("--trials", type=_ints, default=[6, 16, 48], help="the study's --trials in each run")
    p.add_argument("--kill", type=int, default=4, help="workers SIGKILLed mid-trial in the last run (0: none)")
    p.add_argument("--heartbeat", type=int, default=4, help="the workers' --heartbeat (s)")
    p.add_argument("--run-timeout", type=float, default=420, help="a run's limit (s): workers left are stopped")
    p.add_argument("--max-connections", type=int, default=100, help="the server's max_connections (default 100, "
                   "PostgreSQL's own)")
    p.add_argument("--work-dir", type=Path, default=None, help="where the workers' run folders go (default /tmp)")
    p.add_argument("--json", type=Path, default=None, help="write every figure here too")
    args = p.parse_args()
    if len(args.trials) != len(args.workers):
        p.error(f"--trials has {len(args.trials)} values, --workers {len(args.workers)}: give one per run")
    print(f"fleet_scale: {args.workers} workers, trials {args.trials}, {os.cpu_count()} cores", file=sys.stderr)
    results = []
    with postgres_server(settings={"shared_preload_libraries": "pg_stat_statements",
                                   "max_connections": str(args.max_connections)}) as url:
        prepare_server(url)
        pg_pid = postmaster_pid(url)
        for i, (n, trials) in enumerate(zip(args.workers, args.trials)):
            last = i == len(args.workers) - 1
            results.append(run(url, pg_pid, n, trials, args.kill if last else 0, args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
