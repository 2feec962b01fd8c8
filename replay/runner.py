"""Send a trace to an engine on its recorded schedule and record what each request saw.

Open loop (default): request i is sent at `start + time_scale * t_i` whatever the engine is
doing, as real users would; the delay between that target and the actual send is recorded as
schedule lag, so an overloaded client cannot hide behind the engine. Closed loop: `concurrency`
workers send back to back, for saturation tests. A warm-up phase (first requests of the trace,
sent before the clock starts) is never measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Sequence

from tracetune.errors import InputError
from tracetune.engine_adapter.metrics import EngineMetrics
from tracetune.engine_adapter.http_stream import connection_budget
from tracetune.engine_adapter.openai_client import StreamedCompletion, encoded_request, new_session, stream_completion
from tracetune.replay.trace import Trace, TraceRecord


@dataclasses.dataclass
class ReplayOptions:
    time_scale: float = 1.0
    max_requests: int | None = None
    max_duration_s: float | None = None
    warmup_requests: int = 0
    mode: Literal["open", "closed"] = "open"
    concurrency: int = 1
    ignore_eos: bool = True
    max_output_tokens: int | None = None
    request_timeout_s: float = 600.0
    keep_text: bool = False

    def __post_init__(self) -> None:
        if not self.time_scale > 0:
            raise InputError(f"--time-scale must be > 0, got {self.time_scale}")
        if self.mode not in ("open", "closed"):
            raise InputError(f"--mode must be open or closed, got {self.mode!r}")
        if self.concurrency < 1:
            raise InputError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.warmup_requests < 0:
            raise InputError(f"--warmup must be >= 0, got {self.warmup_requests}")


@dataclasses.dataclass
class PreparedRequest:
    """One request ready to send: what to send and when (seconds after the replay starts)."""

    index: int
    id: str | None
    scheduled_s: float
    max_tokens: int
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    extra_body: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RequestRecord:
    """What one measured request did. Times in seconds; `send_s` is relative to replay start."""

    index: int
    id: str | None
    scheduled_s: float
    send_s: float
    lag_s: float
    success: bool
    error: str
    ttft_s: float | None
    e2e_s: float
    itl_s: list[float]
    prompt_tokens: int | None
    output_tokens: int | None
    requested_tokens: int
    finish_reason: str | None
    text: str | None = None
    client_error: bool = False  # failed by the client's machine (file descriptors, ports), not the engine

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (E2E - TTFT) / (output tokens - 1)."""
        if not self.success or self.ttft_s is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    def to_json(self) -> str:
        """One JSON line; times rounded to the microsecond (far below what a clock over HTTP resolves)."""
        data = dataclasses.asdict(self)
        data["tpot_s"] = self.tpot_s
        for key in ("scheduled_s", "send_s", "lag_s", "ttft_s", "e2e_s", "tpot_s"):
            if data[key] is not None:
                data[key] = round(data[key], 6)
        data["itl_s"] = [round(gap, 6) for gap in data["itl_s"]]
        if data["text"] is None:
            del data["text"]
        return json.dumps(data)


@dataclasses.dataclass
class ReplayResult:
    records: list[RequestRecord]
    duration_s: float
    options: ReplayOptions
    engine_delta: EngineMetrics | None = None
    warmup_errors: int = 0
    # A replay stopped early by its `stop_when` (its outcome was already certain): `records` then
    # holds only the requests that finished; `planned` how many the full replay would have sent.
    abandoned: bool = False
    sent: int = 0
    planned: int = 0
    # Requests that waited for a connection: the client's open-file limit capped its connections.
    connection_waits: int = 0
    connection_limit: int = 0

    def write_records(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            for record in self.records:
                f.write(record.to_json() + "\n")


def prepare(trace: Trace, options: ReplayOptions, synthesizer: Any = None) -> list[PreparedRequest]:
    """Apply the options' caps and scaling, and give every request its text."""
    out: list[PreparedRequest] = []
    records: Sequence[TraceRecord] = trace.records
    for index, r in enumerate(records):
        scheduled = r.timestamp * options.time_scale
        if options.max_duration_s is not None and scheduled > options.max_duration_s:
            break
        if options.max_requests is not None and len(out) >= options.max_requests + options.warmup_requests:
            break
        max_tokens = r.output_length
        if options.max_output_tokens is not None:
            max_tokens = min(max_tokens, options.max_output_tokens)
        request = PreparedRequest(index=index, id=r.id, scheduled_s=scheduled, max_tokens=max_tokens)
        if r.messages is not None:
            request.messages = [m.model_dump() for m in r.messages]
        elif r.prompt is not None:
            request.prompt = r.prompt
        else:
            if synthesizer is None:
                raise InputError(
                    f"{trace.source}:{index + 1}: field 'input_length': length-only requests need a "
                    f"tokenizer to synthesise prompts (replay against --engine vllm, or convert the trace "
                    f"first with `tune trace convert`)")
            request.prompt = synthesizer.prompt(r.input_length, hash_ids=r.hash_ids, unique_key=index)
        if r.sampling is not None:
            request.extra_body.update(r.sampling.model_dump(exclude_none=True))
        out.append(request)
    return out


Clock = Callable[[], float]
PROGRESS_EVERY_S = 0.25


@dataclasses.dataclass
class InFlight:
    """A request sent and not finished: clock readings of its send and of its first output event."""

    send: float
    first_output: float | None = None
    scheduled_s: float = 0.0  # its place in the schedule, as in its record


# Called while a replay runs with (finished records, requests in flight, clock now); True stops it.
StopWhen = Callable[[Sequence[RequestRecord], Sequence[InFlight], float], bool]


class Replayer:
    """Runs prepared requests against one endpoint and collects `RequestRecord`s."""

    def __init__(self, base_url: str, model: str, options: ReplayOptions, *, headers: dict[str, str] | None = None,
                 clock: Clock = time.perf_counter,
                 on_progress: Callable[[int, int, int], None] | None = None) -> None:
        self.base_url = base_url
        self.model = model
        self.options = options
        self.headers = headers
        self.clock = clock
        self.on_progress = on_progress
        self._done = 0
        self._in_flight = 0
        self.live: dict[int, InFlight] = {}  # requests in flight, by trace index
        self.finished: list[RequestRecord] = []  # records in the order they finished
        self.abandoned = False
        self.sent = 0
        self.connection_waits = 0
        self._next_progress = 0.0

    def _body(self, request: PreparedRequest) -> bytes:
        temperature = request.extra_body.get("temperature", 0.0)
        extra = {k: v for k, v in request.extra_body.items() if k != "temperature"}
        return encoded_request(model=self.model, prompt=request.prompt, messages=request.messages,
                               max_tokens=request.max_tokens, ignore_eos=self.options.ignore_eos,
                               temperature=temperature, extra_body=extra)

    async def _send(self, session, request: PreparedRequest, body: bytes,
                    on_first_output: Callable[[], None] | None = None) -> StreamedCompletion:
        return await stream_completion(
            session, self.base_url, model=self.model, prompt=request.prompt, messages=request.messages,
            body=body, timeout_s=self.options.request_timeout_s, headers=self.headers, clock=self.clock,
            keep_text=self.options.keep_text, on_first_output=on_first_output,
        )

    async def _measured(self, session, request: PreparedRequest, body: bytes, start: float, total: int,
                        scheduled_s: float) -> RequestRecord:
        send = self.clock()
        live = self.live[request.index] = InFlight(send, scheduled_s=scheduled_s)

        def first_output() -> None:
            live.first_output = self.clock()

        self._in_flight += 1
        self.sent += 1
        try:
            out = await self._send(session, request, body, first_output)
        finally:
            self._in_flight -= 1
            self._done += 1
            del self.live[request.index]
        if self.on_progress:
            now = self.clock()
            if now >= self._next_progress or self._done == total:  # a few times a second is enough to watch
                self._next_progress = now + PROGRESS_EVERY_S
                self.on_progress(self._done, total, self._in_flight)
        record = RequestRecord(
            index=request.index, id=request.id, scheduled_s=scheduled_s, send_s=send - start,
            lag_s=(send - start) - scheduled_s, success=out.success, error=out.error, ttft_s=out.ttft_s,
            e2e_s=out.e2e_s, itl_s=out.itl_s, prompt_tokens=out.prompt_tokens, output_tokens=out.output_tokens,
            requested_tokens=request.max_tokens, finish_reason=out.finish_reason,
            text=out.text if self.options.keep_text else None, client_error=out.client_error,
        )
        self.finished.append(record)
        return record

    async def warmup(self, session, requests: Sequence[PreparedRequest]) -> int:
        """Send the warm-up requests (concurrently, unmeasured); return how many failed."""
        outs = await asyncio.gather(*(self._send(session, r, self._body(r)) for r in requests))
        return sum(not o.success for o in outs)

    def bodies(self, requests: Sequence[PreparedRequest]) -> list[bytes]:
        """Every request's body, encoded before the clock starts (not while the schedule runs)."""
        return [self._body(r) for r in requests]

    async def open_loop(self, session, measured: Sequence[PreparedRequest], bodies: Sequence[bytes], start: float,
                        stop_when: StopWhen | None, t_first: float | None = None) -> None:
        """Send each request at `start` + its scheduled time - `t_first` (default: the first one's);
        with `stop_when`, stop sending and cancel what is in flight as soon as it says the outcome
        is certain."""
        total = len(measured)
        t_first = measured[0].scheduled_s if t_first is None else t_first
        tasks = []

        async def send_all() -> None:
            for request, body in zip(measured, bodies):
                scheduled = request.scheduled_s - t_first
                delay = start + scheduled - self.clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(self._measured(session, request, body, start, total, scheduled)))
            await asyncio.gather(*tasks, return_exceptions=True)

        sender = asyncio.create_task(send_all())
        if stop_when is None:
            await sender
        else:
            while not sender.done():
                await asyncio.wait({sender}, timeout=0.05)
                if not sender.done() and stop_when(self.finished, list(self.live.values()), self.clock()):
                    self.abandoned = True
                    sender.cancel()
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(sender, *tasks, return_exceptions=True)

    async def run(self, requests: Sequence[PreparedRequest], between: Callable[[], Any] | None = None,
                  stop_when: StopWhen | None = None) -> tuple[list[RequestRecord], float, int]:
        """Warm up, call `between()` (e.g. snapshot engine counters), then replay; return records,
        measured duration and warm-up failures. `stop_when` (open loop only) may end the replay
        early: `self.abandoned` then says so and the records are those that finished."""
        warm, measured = split_warmup(requests, self.options)
        async with new_session() as session:
            warm_failed = await self.warmup(session, warm) if warm else 0
            if between is not None:
                await between()
            total = len(measured)
            bodies = self.bodies(measured) if self.options.mode == "open" else []
            start = self.clock()
            if self.options.mode == "open":
                await self.open_loop(session, measured, bodies, start, stop_when)
            else:
                queue: asyncio.Queue[PreparedRequest] = asyncio.Queue()
                for request in measured:
                    queue.put_nowait(request)

                async def worker() -> None:
                    while not queue.empty():
                        request = queue.get_nowait()
                        # Closed loop: the schedule is "now"; lag is zero by definition.
                        await self._measured(session, request, self._body(request), start, total,
                                             self.clock() - start)

                await asyncio.gather(*(worker() for _ in range(self.options.concurrency)))
            duration = self.clock() - start
            records = sorted(self.finished, key=lambda r: r.index)
            self.connection_waits = session.waits
        return records, duration, warm_failed


@contextlib.contextmanager
def quiet_gc() -> Iterator[None]:
    """No full garbage collection while a schedule runs. A full collection walks every object the
    replay holds (its records grow with every request) and stopped this process for tens of ms at a
    time, which a client sending thousands of requests a second shows as schedule lag (measured:
    lag p99 41 ms at 3,200 req/s with it, 1.3 ms without). The objects alive at the start are frozen
    out of collection and the oldest generation is never collected automatically; young ones still
    are. Afterwards: everything as it was, and one full collection."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(thresholds[0], thresholds[1], 1 << 30)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
        gc.collect()


def loop_runner() -> Callable[[Any], Any]:
    """uvloop's `run` where installed (the client's numbers were measured on it), else asyncio's."""
    try:
        import uvloop
        return uvloop.run
    except ImportError:
        return asyncio.run


def split_warmup(requests: Sequence[PreparedRequest], options: ReplayOptions
                 ) -> tuple[list[PreparedRequest], list[PreparedRequest]]:
    """The warm-up requests (first of the trace) and the measured ones."""
    n_warm = min(options.warmup_requests, len(requests))
    warm, measured = list(requests[:n_warm]), list(requests[n_warm:])
    if not measured:
        raise InputError("nothing left to measure after the warm-up; lower --warmup or raise --max-requests")
    return warm, measured


def replay(base_url: str, model: str, requests: Sequence[PreparedRequest], options: ReplayOptions, *,
           engine: Any = None, headers: dict[str, str] | None = None,
           on_progress: Callable[[int, int, int], None] | None = None,
           stop_when: StopWhen | None = None, client_procs: int = 1, pool: Any = None) -> ReplayResult:
    """Run a replay to completion, or until `stop_when` says its outcome is certain (uvloop when
    available). `engine`, if given, supplies `metrics()` snapshots taken after the warm-up and at
    the end. An open-loop replay with `client_procs` > 1 (or a `replay.workers.ClientPool`) is sent
    by that many client processes; the warm-up is sent from this one."""
    if pool is None and client_procs > 1 and options.mode == "open":
        from tracetune.replay.workers import ClientPool

        with ClientPool(client_procs) as own:
            return replay(base_url, model, requests, options, engine=engine, headers=headers,
                          on_progress=on_progress, stop_when=stop_when, pool=own)
    if pool is not None and options.mode == "open":
        return _pooled(base_url, model, requests, options, engine, headers, on_progress, stop_when, pool)
    return _single(base_url, model, requests, options, engine, headers, on_progress, stop_when)


def _pooled(base_url, model, requests, options, engine, headers, on_progress, stop_when, pool) -> ReplayResult:
    warm, measured = split_warmup(requests, options)
    replayer = Replayer(base_url, model, options, headers=headers)

    async def warm_up() -> tuple[int, EngineMetrics | None]:
        failed = 0
        if warm:
            async with new_session() as session:
                failed = await replayer.warmup(session, warm)
        before = await asyncio.to_thread(engine.metrics) if engine is not None else None
        return failed, before

    warm_failed, before = loop_runner()(warm_up())
    run = pool.run(base_url, model, measured, options, headers=headers, stop_when=stop_when, on_progress=on_progress)
    delta = engine.metrics().delta(before) if engine is not None and before is not None else None
    return ReplayResult(records=run.records, duration_s=run.duration_s, options=options, engine_delta=delta,
                        warmup_errors=warm_failed, abandoned=run.abandoned, sent=run.sent, planned=len(measured),
                        connection_waits=run.connection_waits, connection_limit=connection_budget())


def _single(base_url, model, requests, options, engine, headers, on_progress, stop_when) -> ReplayResult:
    replayer = Replayer(base_url, model, options, headers=headers, on_progress=on_progress)
    before: list[EngineMetrics] = []

    async def snapshot() -> None:
        if engine is not None:
            before.append(await asyncio.to_thread(engine.metrics))

    async def main() -> tuple[list[RequestRecord], float, int, EngineMetrics | None]:
        records, duration, warm_failed = await replayer.run(requests, between=snapshot, stop_when=stop_when)
        delta = None
        if engine is not None and before:
            delta = (await asyncio.to_thread(engine.metrics)).delta(before[0])
        return records, duration, warm_failed, delta

    with quiet_gc():
        records, duration, warm_failed, delta = loop_runner()(main())
    planned = max(len(requests) - min(options.warmup_requests, len(requests)), 0)
    return ReplayResult(records=records, duration_s=duration, options=options, engine_delta=delta,
                        warmup_errors=warm_failed, abandoned=replayer.abandoned, sent=replayer.sent, planned=planned,
                        connection_waits=replayer.connection_waits, connection_limit=connection_budget())
