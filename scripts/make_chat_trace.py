"""Rebuild examples/chat.jsonl, the quickstart's trace: a minute of a real chat service's arrivals
with real user prompts, small enough for a 2-core machine.

- Arrivals and output lengths: the first 60 requests of the Azure LLM inference trace 2023
  (conversation service; examples/public_traces/azure2023_conv_60.csv): 30 s of real arrivals,
  about 2 requests/s with the trace's own bursts (up to 5 in one second), outputs of 12-404 tokens.
- Prompts: the ShareGPT first-turn prompts in examples/public_traces/sharegpt_v3_filtered_250.json,
  in order, skipping those over MAX_PROMPT_TOKENS tokens of the bundled model's tokenizer (the Azure
  trace's own inputs, 1,020 tokens at the median, are a prefill a 2-core CPU cannot serve within a
  2 s first token; the trace carries no text).

    .venv/bin/python scripts/make_chat_trace.py   # needs the bundled model: tune model prepare
"""

from __future__ import annotations

import csv
import datetime
import json
from pathlib import Path

from transformers import AutoTokenizer

from tracetune.engine_adapter.models import resolve_model

ROOT = Path(__file__).resolve().parents[1]
AZURE = ROOT / "examples/public_traces/azure2023_conv_60.csv"
SHAREGPT = ROOT / "examples/public_traces/sharegpt_v3_filtered_250.json"
OUT = ROOT / "examples/chat.jsonl"
MAX_PROMPT_TOKENS = 256


def arrivals() -> list[tuple[float, int]]:
    """(seconds since the first request, output tokens) of each Azure request."""
    rows = list(csv.DictReader(AZURE.open()))
    times = [datetime.datetime.fromisoformat(r["TIMESTAMP"][:26]) for r in rows]
    return [(round((t - times[0]).total_seconds(), 3), int(r["GeneratedTokens"])) for t, r in zip(times, rows)]


def prompts(limit: int) -> list[str]:
    """The first `limit` ShareGPT prompts of at most MAX_PROMPT_TOKENS tokens."""
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(None)))
    out = []
    for entry in json.loads(SHAREGPT.read_text()):
        text = entry["conversations"][0]["value"]
        if len(tokenizer(text)["input_ids"]) <= MAX_PROMPT_TOKENS:
            out.append(text)
        if len(out) == limit:
            return out
    raise SystemExit(f"only {len(out)} prompts of at most {MAX_PROMPT_TOKENS} tokens in {SHAREGPT}")


def main() -> None:
    timed = arrivals()
    with OUT.open("w") as f:
        for i, ((t, output), prompt) in enumerate(zip(timed, prompts(len(timed)))):
            f.write(json.dumps({"timestamp": t, "prompt": prompt, "output_length": output, "id": f"chat-{i}"}) + "\n")
    print(f"wrote {OUT} ({len(timed)} requests over {timed[-1][0]:.1f} s)")


if __name__ == "__main__":
    main()
