"""The replay's data: its options, a request ready to send, what one request did, a whole replay's
result, and a request still in flight (what a `stop_when` sees while a replay runs). The runner,
its client processes (`replay.client_procs`), the metrics and the capacity search all read them here."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Annotated, Literal, Self

from pydantic import Field

from tracetune.engine_adapter.metrics import EngineMetrics
from tracetune.errors import InputError
from tracetune.stored import Record, rounded
from tracetune.types import JsonDict


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
    messages: list[JsonDict] | None = None
    extra_body: JsonDict = dataclasses.field(default_factory=dict)
    input_tokens: float = 0.0  # the trace's input length (estimated from characters for text): picks a level's parts
    synthesized: bool = False  # its prompt was synthesized to the trace's length, not recorded text


# The error of a request cut off, unfinished, once its level's outcome was certain (`capacity.levels`):
# not a failure of the engine. Its TTFT (when it had no first token) and E2E are then its life so far.
CUT_PREFIX = "cut: "


# A time as a request record stores it: to the microsecond (far below what a clock over HTTP resolves).
Seconds = Annotated[float, rounded(6)]


@dataclasses.dataclass
class RequestRecord(Record[dict[str, object]]):
    """What one measured request did. Times in seconds; `send_s` is relative to replay start.

    Stored as one JSON line (`to_json`) with its TPOT (`derived`: not read back); the text and the
    draft counts only where kept or reported. A field an older tracetune did not write takes its
    default; read back, a record is judged by today's rules (`recounted`)."""

    index: int
    id: str | None = None
    scheduled_s: Seconds = 0.0
    send_s: Seconds = 0.0
    lag_s: Seconds = 0.0
    success: bool = False
    error: str = ""
    ttft_s: Seconds | None = None
    e2e_s: Seconds = 0.0
    itl_s: list[Seconds] = dataclasses.field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    requested_tokens: int = 0
    finish_reason: str | None = None
    # Left out only where not kept: a kept empty text (a failed request's) is stored, which
    # `unset_omitted` (it drops "" too) would not say.
    text: Annotated[str | None, Field(exclude_if=lambda text: text is None)] = None
    client_error: bool = False  # failed by the client's machine (file descriptors, ports), not the engine
    # Speculative decoding's draft tokens proposed and accepted for this request, where the server
    # reported them in its answer (llama-server's `timings`; `StreamedCompletion`); None otherwise.
    draft_tokens: int | None = None
    accepted_tokens: int | None = None

    unset_omitted = ("draft_tokens", "accepted_tokens")

    @property
    def cut(self) -> bool:
        """Cut off unfinished once its level's outcome was certain (`CUT_PREFIX`), not failed."""
        return not self.success and self.error.startswith(CUT_PREFIX)

    def least(self, metric: str) -> float | None:
        """The least its TTFT ("ttft") or E2E can be: its own where it succeeded; where it was cut, its
        life so far (its TTFT where it had its first token); None where it failed."""
        if self.success:
            return self.ttft_s if metric == "ttft" else self.e2e_s
        if not self.cut:
            return None
        return self.ttft_s if metric == "ttft" and self.ttft_s is not None else self.e2e_s

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (E2E - TTFT) / (output tokens - 1)."""
        if not self.success or self.ttft_s is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    def derived(self) -> dict[str, object]:
        tpot = self.tpot_s
        return {"tpot_s": None if tpot is None else round(tpot, 6)}

    def to_json(self) -> str:
        """One JSON line: `as_dict`'s."""
        return json.dumps(self.as_dict())

    @classmethod
    def from_dict(cls, raw: object) -> Self:
        return super().from_dict(raw).recounted()

    def recounted(self) -> Self:
        """This record with its output tokens counted as the streaming client counts them
        (`openai_client.counted_tokens`: the usage, checked against the output events received,
        and those events where the usage is missing). A tracetune before that rule stored some
        successes with no count (a server's `usage: null`), more tokens than max_tokens or fewer
        than the events received: read back, the first is counted from its events and the others
        are failures with the reason, so no summary builds a throughput on them."""
        if not self.success:
            return self
        from tracetune.engine_adapter.openai_client import counted_tokens

        events = len(self.itl_s) + 1 if self.ttft_s is not None else 0
        tokens, error = counted_tokens(self.output_tokens, events, self.requested_tokens or None)
        if error:
            return dataclasses.replace(self, success=False, error=error)
        return self if tokens == self.output_tokens else dataclasses.replace(self, output_tokens=tokens)


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


@dataclasses.dataclass
class InFlight:
    """A request sent and not finished: clock readings of its send and of its first output event."""

    send: float
    first_output: float | None = None
    scheduled_s: float = 0.0  # its place in the schedule, as in its record
    send_s: float | None = None  # its send, relative to the replay's start as in its record (None: on schedule)

    @property
    def sent_s(self) -> float:
        """Its send relative to the replay's start: `send_s`, or its place in the schedule."""
        return self.scheduled_s if self.send_s is None else self.send_s


# Called while a replay runs with (finished records, requests in flight, clock now); True stops it.
StopWhen = Callable[[Sequence[RequestRecord], Sequence[InFlight], float], bool]
