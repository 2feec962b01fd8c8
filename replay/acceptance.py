"""Where a speculative configuration's draft acceptance comes from.

A replay forces every output to its recorded length (ignore-EOS), and a model made to go on past
its natural end repeats itself: drafts look perfect there. Prompts synthesized to a trace's token
counts are not the text users send either. So a speculative trial's acceptance is measured again on
the trace's own prompts, one request at a time, greedy, twice per prompt:

- natural: stopped where the model stops (its end-of-sequence), up to the recorded length;
- forced: ignore-EOS, the recorded length, as the replay sends it.

Greedy decoding is deterministic and speculation lossless, so the forced output begins with the
natural one: what the forced pass drafted and accepted beyond the natural pass is what speculation
did past the natural end. Draft counts come from the engine's counters read before and after each
request (`spec_decode_*`: vLLM's and llama-server's), else from the response where the engine
reports them there alone (llama.cpp's `timings`; `replay.metrics.with_reported_drafts`).
`Acceptance.caveats` says when the figure a trial carries rests mostly on tokens past the natural
end, on synthesized prompts, or on too few draft tokens to say.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from tracetune.engine_adapter.metrics import EngineMetrics
from tracetune.replay.metrics import with_reported_drafts
from tracetune.replay.types import PreparedRequest
from tracetune.stored import Record

if TYPE_CHECKING:
    from tracetune.engine_adapter.base import Engine
    from tracetune.engine_adapter.openai_client import Session, StreamedCompletion

# Past this share of the accepted draft tokens after the natural end, or of the prompts synthesized,
# the acceptance rests "mostly" on text users never produce.
MOSTLY = 0.5
# Fewer natural-stop draft tokens than this, and the natural acceptance is too noisy to stand for the
# trial (a binomial share of 32 has a 95% interval of about +-17 points).
MIN_DRAFTED = 32


@dataclasses.dataclass(frozen=True)
class Pass(Record[dict[str, object]]):
    """One pass over the probe's prompts: output tokens, draft tokens proposed and accepted, the
    drafts (verification steps that drafted; 0 where the engine does not count them) and each
    request's time per output token. A count stored as no number reads as 0, such a time is left out."""

    tokens: int = 0
    drafted: float = 0.0
    accepted: float = 0.0
    drafts: float = 0.0
    tpot_s: tuple[float, ...] = ()

    @property
    def rate(self) -> float:
        """Accepted over proposed draft tokens; NaN when nothing was drafted."""
        return self.accepted / self.drafted if self.drafted > 0 else math.nan

    @property
    def tokens_per_step(self) -> float:
        """Tokens one verification step yields (1 + accepted per draft): the most speculation can
        speed decoding up by; NaN where the engine does not count drafts."""
        return 1.0 + self.accepted / self.drafts if self.drafts > 0 else math.nan

    @property
    def tpot_p50_s(self) -> float:
        return statistics.median(self.tpot_s) if self.tpot_s else math.nan

    def plus(self, seen: _Observed) -> Pass:
        """This pass with one more request."""
        counted = seen.counted
        return Pass(self.tokens + seen.tokens, self.drafted + counted.spec_decode_draft_tokens,
                    self.accepted + counted.spec_decode_accepted_tokens, self.drafts + counted.spec_decode_drafts,
                    self.tpot_s + ((seen.tpot_s,) if seen.tpot_s is not None else ()))


@dataclasses.dataclass(frozen=True)
class Acceptance(Record[dict[str, object]]):
    """The acceptance probe of one speculative configuration: `prompts` measured (`recorded` of them
    the trace's own text, the rest synthesized to its lengths; `ended` stopped by the model before
    their recorded length), each once forced and once with natural stops; `failed` dropped. Stored
    with its rates and caveats (`derived`: read back, they are derived again)."""

    prompts: int = 0
    recorded: int = 0
    ended: int = 0
    failed: int = 0
    forced: Pass = Pass()
    natural: Pass = Pass()
    synthetic: Pass = Pass()  # the natural pass over the synthesized prompts alone

    @property
    def past_end_tokens(self) -> int:
        """Output tokens the forced pass generated after the model's natural end."""
        return max(0, self.forced.tokens - self.natural.tokens)

    @property
    def past_end_share(self) -> float:
        """Of the draft tokens the forced pass accepted, the share accepted past the natural end;
        NaN when it accepted none."""
        if self.forced.accepted <= 0:
            return math.nan
        if not self.past_end_tokens:  # both passes generated the same tokens: draft counts differ by chance
            return 0.0
        return min(1.0, max(0.0, (self.forced.accepted - self.natural.accepted) / self.forced.accepted))

    @property
    def past_end_rate(self) -> float:
        """Acceptance on the tokens past the natural end alone; NaN when none were drafted there."""
        drafted = self.forced.drafted - self.natural.drafted
        if not self.past_end_tokens or drafted <= 0:
            return math.nan
        return min(1.0, max(0.0, (self.forced.accepted - self.natural.accepted) / drafted))

    @property
    def synthesized(self) -> int:
        return self.prompts - self.recorded

    @property
    def recorded_rate(self) -> float:
        """Acceptance with natural stops on the prompts the trace recorded; NaN without any."""
        drafted = self.natural.drafted - self.synthetic.drafted
        return (self.natural.accepted - self.synthetic.accepted) / drafted if drafted > 0 else math.nan

    def caveats(self) -> list[str]:
        """Why this acceptance does not stand for the user's traffic ([] when it does)."""
        out = []
        share = self.past_end_share
        if not math.isnan(share) and share > MOSTLY:
            out.append(f"{share:.0%} of the accepted draft tokens came after the model's natural end (forced "
                       f"by ignore-EOS); with natural stops {_percent(self.natural.rate)} were accepted, "
                       f"against {_percent(self.forced.rate)} forced")
        if self.prompts and self.synthesized / self.prompts > MOSTLY:
            out.append(f"measured on prompts synthesized to the trace's lengths ({self.synthesized} of "
                       f"{self.prompts}), not text users sent: record prompts (`tune record`) to measure it")
        if self.natural.drafted < MIN_DRAFTED:
            out.append(f"with natural stops only {self.natural.drafted:.0f} draft tokens were proposed "
                       f"(fewer than {MIN_DRAFTED}): too few to measure acceptance")
        return out

    def words(self) -> str:
        """One line: acceptance and TPOT natural against forced, and where they came from."""
        return (f"draft tokens accepted {_percent(self.natural.rate)} with natural stops, "
                f"{_percent(self.forced.rate)} forced to the recorded lengths ({self.ended} of {self.prompts} "
                f"prompts ended early; {_percent(self.past_end_share)} of accepted tokens past the end); "
                f"TPOT p50 one request at a time {_ms(self.natural.tpot_p50_s)} natural, "
                f"{_ms(self.forced.tpot_p50_s)} forced; {self.recorded} of {self.prompts} prompts recorded text"
                + (f" (accepted {_percent(self.recorded_rate)} there, {_percent(self.synthetic.rate)} on the "
                   f"synthesized)" if self.recorded and self.synthesized else ""))

    def derived(self) -> dict[str, object]:
        return {"natural_rate": _finite(self.natural.rate), "forced_rate": _finite(self.forced.rate),
                "past_end_share": _finite(self.past_end_share), "caveats": self.caveats()}



def stored_acceptance(raw: object) -> Acceptance | None:
    """An acceptance probe as `as_dict` stored it; None for no probe (nothing stored, or no forced pass)."""
    return Acceptance.from_dict(raw) if isinstance(raw, Mapping) and "forced" in raw else None


def _finite(value: float) -> float | None:
    """A rate as stored: None where it is undefined (strict JSON has no NaN)."""
    return None if math.isnan(value) else value


def _percent(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.0%}"


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.0f} ms"


def probe_requests(requests: Sequence[PreparedRequest], n: int, max_tokens: int) -> list[PreparedRequest]:
    """`n` of the replay's requests with distinct prompts, evenly spaced over the trace (so recorded
    and synthesized text, short and long, appear as often as in it), each capped at `max_tokens`
    output tokens."""
    distinct: dict[str, PreparedRequest] = {}
    for request in requests:
        key = request.prompt if request.prompt is not None else repr(request.messages)
        distinct.setdefault(key, request)
    chosen = list(distinct.values())
    if len(chosen) > n:
        chosen = [chosen[round(i * (len(chosen) - 1) / max(1, n - 1))] for i in range(n)] if n > 1 else chosen[:1]
    return [dataclasses.replace(r, max_tokens=min(r.max_tokens, max_tokens), extra_body={}) for r in chosen]


@dataclasses.dataclass(frozen=True)
class _Observed:
    """One request of the probe: its output tokens, how it ended, the engine's counters over it, TPOT."""

    ok: bool
    tokens: int
    stopped: bool  # the model ended it (finish reason "stop"), not the length
    counted: EngineMetrics
    tpot_s: float | None


async def _counted(engine: Engine, before: EngineMetrics, tokens: int, wait_s: float = 2.0) -> EngineMetrics:
    """The engine's counters since `before`, once they count the request's `tokens` (an engine may
    publish a step's counters a moment after the response ends; waited for up to `wait_s`)."""
    deadline = time.monotonic() + wait_s
    counted = engine.metrics().delta(before)
    counts = before.generation_tokens > 0 or counted.generation_tokens > 0  # it counts tokens at all
    while counts and counted.generation_tokens < tokens and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        counted = engine.metrics().delta(before)
    return counted


async def _observe(engine: Engine, session: Session, request: PreparedRequest, forced: bool,
                   timeout_s: float) -> _Observed:
    before = engine.metrics()
    out: StreamedCompletion = await engine.stream(
        session, prompt=request.prompt, messages=request.messages, max_tokens=request.max_tokens,
        ignore_eos=forced, temperature=0.0, keep_text=False, timeout_s=timeout_s)
    tokens = out.output_tokens or 0
    counted = with_reported_drafts(await _counted(engine, before, tokens), [out])
    tpot = (out.e2e_s - out.ttft_s) / (tokens - 1) if out.success and out.ttft_s is not None and tokens > 1 else None
    return _Observed(out.success and tokens > 0, tokens, out.finish_reason == "stop", counted, tpot)


def measure_acceptance(engine: Engine, requests: Sequence[PreparedRequest], *, timeout_s: float = 600.0,
                       on_prompt: Callable[[int, int], None] | None = None) -> Acceptance:
    """Each of `requests` (`probe_requests`) once with natural stops and once forced, one at a
    time on the started `engine`; `on_prompt(done, total)` after each prompt."""
    from tracetune.engine_adapter.openai_client import new_session

    async def run() -> Acceptance:
        result = Acceptance()
        async with new_session(timeout_s=timeout_s) as session:
            for done, request in enumerate(requests, 1):
                natural = await _observe(engine, session, request, False, timeout_s)
                forced = await _observe(engine, session, request, True, timeout_s)
                result = _added(result, request, natural, forced)
                if on_prompt:
                    on_prompt(done, len(requests))
        return result

    return asyncio.run(run())


def _added(result: Acceptance, request: PreparedRequest, natural: _Observed, forced: _Observed) -> Acceptance:
    """`result` with one prompt's pair of passes (a prompt with a failed pass is counted as failed)."""
    if not (natural.ok and forced.ok):
        return dataclasses.replace(result, failed=result.failed + 1)
    ended = natural.stopped and natural.tokens < forced.tokens
    return dataclasses.replace(
        result, prompts=result.prompts + 1, recorded=result.recorded + (not request.synthesized),
        ended=result.ended + ended, natural=result.natural.plus(natural), forced=result.forced.plus(forced),
        synthetic=result.synthetic.plus(natural) if request.synthesized else result.synthetic)


def caveat_line(acceptance: Acceptance | None) -> str:
    """An acceptance probe's caveats in one line, as every verdict, table and export says them ('' when
    there is no probe, or no caveat)."""
    return "; ".join(acceptance.caveats()) if acceptance is not None else ""


def stored_caveats(summary: object) -> str:
    """A stored summary's acceptance caveats in one line (`caveat_line`)."""
    stored = summary.get("acceptance") if isinstance(summary, Mapping) else None
    return caveat_line(stored_acceptance(stored))
