"""Send a trace to an engine on its recorded schedule and record what each request saw.

Open loop (default): request i is sent at `start + time_scale * t_i` whatever the engine is
doing, as real users would; the delay between that target and the actual send is recorded as
schedule lag, so an overloaded client cannot hide behind the engine. Closed loop: `concurrency`
workers send back to back, for saturation tests. A warm-up phase (first requests of the trace,
sent before the clock starts) is never measured.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

from engine_adapter.errors import InputError
from engine_adapter.metrics import EngineMetrics
from engine_adapter.openai_client import StreamedCompletion, new_session, stream_completion
from replay.trace import Trace, TraceRecord


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


@dataclasses.dataclass
class InFlight:
    """A request sent and not finished: clock readings of its send and of its first output event."""

    send: float
    first_output: float | None = None


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
        self._live: dict[int, InFlight] = {}
        self._finished: list[RequestRecord] = []
        self.abandoned = False
        self.sent = 0

    async def _send(self, session, request: PreparedRequest, on_text: Callable[[str], None] | None = None
                    ) -> StreamedCompletion:
        temperature = request.extra_body.get("temperature", 0.0)
        extra = {k: v for k, v in request.extra_body.items() if k != "temperature"}
        return await stream_completion(
            session, self.base_url, model=self.model, prompt=request.prompt, messages=request.messages,
            max_tokens=request.max_tokens, ignore_eos=self.options.ignore_eos, temperature=temperature,
            extra_body=extra, timeout_s=self.options.request_timeout_s, headers=self.headers, clock=self.clock,
            on_text=on_text,
        )

    async def _measured(self, session, request: PreparedRequest, start: float, total: int,
                        scheduled_s: float) -> RequestRecord:
        send = self.clock()
        live = self._live[request.index] = InFlight(send)

        def first_output(_: str) -> None:
            if live.first_output is None:
                live.first_output = self.clock()

        self._in_flight += 1
        self.sent += 1
        try:
            out = await self._send(session, request, first_output)
        finally:
            self._in_flight -= 1
            self._done += 1
            del self._live[request.index]
        if self.on_progress:
            self.on_progress(self._done, total, self._in_flight)
        record = RequestRecord(
            index=request.index, id=request.id, scheduled_s=scheduled_s, send_s=send - start,
            lag_s=(send - start) - scheduled_s, success=out.success, error=out.error, ttft_s=out.ttft_s,
            e2e_s=out.e2e_s, itl_s=out.itl_s, prompt_tokens=out.prompt_tokens, output_tokens=out.output_tokens,
            requested_tokens=request.max_tokens, finish_reason=out.finish_reason,
            text=out.text if self.options.keep_text else None,
        )
        self._finished.append(record)
        return record

    async def warmup(self, session, requests: Sequence[PreparedRequest]) -> int:
        """Send the warm-up requests (concurrently, unmeasured); return how many failed."""
        outs = await asyncio.gather(*(self._send(session, r) for r in requests))
        return sum(not o.success for o in outs)

    async def _open_loop(self, session, measured: Sequence[PreparedRequest], start: float,
                         stop_when: StopWhen | None) -> None:
        """Send each request at its scheduled time; with `stop_when`, stop sending and cancel what is
        in flight as soon as it says the outcome is certain."""
        total = len(measured)
        t_first = measured[0].scheduled_s
        tasks = []

        async def send_all() -> None:
            for request in measured:
                scheduled = request.scheduled_s - t_first
                delay = start + scheduled - self.clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(self._measured(session, request, start, total, scheduled)))
            await asyncio.gather(*tasks, return_exceptions=True)

        sender = asyncio.create_task(send_all())
        if stop_when is None:
            await sender
        else:
            while not sender.done():
                await asyncio.wait({sender}, timeout=0.05)
                if not sender.done() and stop_when(self._finished, list(self._live.values()), self.clock()):
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
        n_warm = min(self.options.warmup_requests, len(requests))
        warm, measured = list(requests[:n_warm]), list(requests[n_warm:])
        if not measured:
            raise InputError("nothing left to measure after the warm-up; lower --warmup or raise --max-requests")
        async with new_session() as session:
            warm_failed = await self.warmup(session, warm) if warm else 0
            if between is not None:
                await between()
            total = len(measured)
            start = self.clock()
            if self.options.mode == "open":
                await self._open_loop(session, measured, start, stop_when)
            else:
                queue: asyncio.Queue[PreparedRequest] = asyncio.Queue()
                for request in measured:
                    queue.put_nowait(request)

                async def worker() -> None:
                    while not queue.empty():
                        request = queue.get_nowait()
                        # Closed loop: the schedule is "now"; lag is zero by definition.
                        await self._measured(session, request, start, total, self.clock() - start)

                await asyncio.gather(*(worker() for _ in range(self.options.concurrency)))
            duration = self.clock() - start
            records = sorted(self._finished, key=lambda r: r.index)
        return records, duration, warm_failed


def replay(base_url: str, model: str, requests: Sequence[PreparedRequest], options: ReplayOptions, *,
           engine: Any = None, headers: dict[str, str] | None = None,
           on_progress: Callable[[int, int, int], None] | None = None,
           stop_when: StopWhen | None = None) -> ReplayResult:
    """Run a replay to completion, or until `stop_when` says its outcome is certain (uvloop when
    available). `engine`, if given, supplies `metrics()` snapshots taken after the warm-up and at
    the end."""
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

    try:
        import uvloop
        run_loop = uvloop.run
    except ImportError:
        run_loop = asyncio.run
    records, duration, warm_failed, delta = run_loop(main())
    planned = max(len(requests) - min(options.warmup_requests, len(requests)), 0)
    return ReplayResult(records=records, duration_s=duration, options=options, engine_delta=delta,
                        warmup_errors=warm_failed, abandoned=replayer.abandoned, sent=replayer.sent, planned=planned)
