"""Send a trace to an engine on its recorded schedule and record what each request saw.

Open loop (default): request i is sent at `start + time_scale * t_i` whatever the engine is
doing, as real users would; the delay between that target and the actual send is recorded as
schedule lag, so an overloaded client cannot hide behind the engine. Closed loop: `concurrency`
workers send back to back, for saturation tests. A warm-up phase (first requests of the trace,
sent before the clock starts) is never measured.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from tracetune.engine_adapter.http_stream import connection_budget
from tracetune.engine_adapter.metrics import EngineMetrics
from tracetune.engine_adapter.openai_client import new_session
from tracetune.errors import InputError
from tracetune.replay.profile import input_tokens
from tracetune.replay.replayer import Replayer, loop_runner, quiet_gc, split_warmup
from tracetune.replay.trace import Trace, TraceRecord
from tracetune.replay.types import PreparedRequest, ReplayOptions, ReplayResult, RequestRecord, StopWhen

if TYPE_CHECKING:
    from tracetune.replay.client_procs import ClientPool
    from tracetune.replay.synth import PromptSynthesizer

OnProgress = Callable[[int, int, int], None]
OnRecord = Callable[[RequestRecord], None]


class MetricsSource(Protocol):
    """An engine as a replay reads it: snapshots of its counters (`engine_adapter.base.Engine` meets it)."""

    def metrics(self) -> EngineMetrics: ...


def kept(records: Sequence[TraceRecord], options: ReplayOptions) -> list[TraceRecord]:
    """The trace's first records that the options' --max-duration (in replay seconds) and
    --max-requests (warm-up requests not counted) keep: all of them when neither is set."""
    out: list[TraceRecord] = []
    for r in records:
        if options.max_duration_s is not None and r.timestamp * options.time_scale > options.max_duration_s:
            break
        if options.max_requests is not None and len(out) >= options.max_requests + options.warmup_requests:
            break
        out.append(r)
    return out


def prepare(trace: Trace, options: ReplayOptions,
            synthesizer: PromptSynthesizer | None = None) -> list[PreparedRequest]:
    """Apply the options' caps and scaling, and give every request its text."""
    out: list[PreparedRequest] = []
    for index, r in enumerate(kept(trace.records, options)):
        scheduled = r.timestamp * options.time_scale
        max_tokens = r.output_length
        if options.max_output_tokens is not None:
            max_tokens = min(max_tokens, options.max_output_tokens)
        request = PreparedRequest(index=index, id=r.id, scheduled_s=scheduled, max_tokens=max_tokens,
                                  input_tokens=input_tokens(r)[0])
        if r.messages is not None:
            request.messages = [m.model_dump() for m in r.messages]
        elif r.prompt is not None:
            request.prompt = r.prompt
        else:
            assert r.input_length is not None  # a record holds messages, a prompt or an input length
            if synthesizer is None:
                raise InputError(
                    f"{trace.source}:{index + 1}: field 'input_length': length-only requests need a "
                    f"tokenizer to synthesise prompts (the served model's: --model, or --tokenizer DIR with "
                    f"--endpoint), or convert the trace first with `tune trace convert`")
            request.prompt = synthesizer.prompt(r.input_length, hash_ids=r.hash_ids, unique_key=index)
            request.synthesized = True
        if r.sampling is not None:
            request.extra_body.update(r.sampling.model_dump(exclude_none=True))
        out.append(request)
    return out



def replay(base_url: str, model: str, requests: Sequence[PreparedRequest], options: ReplayOptions, *,
           engine: MetricsSource | None = None, headers: dict[str, str] | None = None,
           on_progress: OnProgress | None = None,
           stop_when: StopWhen | None = None, client_procs: int = 1, pool: ClientPool | None = None,
           on_record: OnRecord | None = None) -> ReplayResult:
    """Run a replay to completion, or until `stop_when` says its outcome is certain (uvloop when
    available). `engine`, if given, supplies `metrics()` snapshots taken after the warm-up and at
    the end. An open-loop replay with `client_procs` > 1 (or a `replay.client_procs.ClientPool`) is sent
    by that many client processes; the warm-up is sent from this one. `on_record` is called with
    each measured request's record as it finishes (a caller keeps them on disk as they come)."""
    if pool is None and client_procs > 1 and options.mode == "open":
        from tracetune.replay.client_procs import ClientPool

        with ClientPool(client_procs) as own:
            return replay(base_url, model, requests, options, engine=engine, headers=headers,
                          on_progress=on_progress, stop_when=stop_when, pool=own, on_record=on_record)
    if pool is not None and options.mode == "open":
        return _pooled(base_url, model, requests, options, engine, headers, on_progress, stop_when, pool, on_record)
    return _single(base_url, model, requests, options, engine, headers, on_progress, stop_when, on_record)


def _pooled(base_url: str, model: str, requests: Sequence[PreparedRequest], options: ReplayOptions,
            engine: MetricsSource | None, headers: dict[str, str] | None, on_progress: OnProgress | None,
            stop_when: StopWhen | None, pool: ClientPool, on_record: OnRecord | None = None) -> ReplayResult:
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
    run = pool.run(base_url, model, measured, options, headers=headers, stop_when=stop_when, on_progress=on_progress,
                   on_record=on_record)
    delta = engine.metrics().delta(before) if engine is not None and before is not None else None
    return ReplayResult(records=run.records, duration_s=run.duration_s, options=options, engine_delta=delta,
                        warmup_errors=warm_failed, abandoned=run.abandoned, sent=run.sent, planned=len(measured),
                        connection_waits=run.connection_waits, connection_limit=connection_budget())


def _single(base_url: str, model: str, requests: Sequence[PreparedRequest], options: ReplayOptions,
            engine: MetricsSource | None, headers: dict[str, str] | None, on_progress: OnProgress | None,
            stop_when: StopWhen | None, on_record: OnRecord | None = None) -> ReplayResult:
    replayer = Replayer(base_url, model, options, headers=headers, on_progress=on_progress, on_record=on_record)
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
