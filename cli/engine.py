"""`tune model prepare`, `tune engine check` and `tune engine command`; `console` is the one every
command prints to."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shlex
import statistics
import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from tracetune.engine_adapter.kind import EngineConfig, EngineKind

console = Console()


def _progress(message: str) -> None:
    console.print(f"[dim]·[/] {message}", soft_wrap=True)  # a path is never cut into lines


def model_prepare(args: argparse.Namespace, console: Console = console) -> int:
    from tracetune.engine_adapter.models import resolve_model

    t0 = time.perf_counter()
    with console.status("preparing model…"):
        path = resolve_model(args.model, _progress)
    console.print(f"model directory: [bold]{path}[/] ({time.perf_counter() - t0:.1f}s)", soft_wrap=True)
    return 0


def _config_from(args: argparse.Namespace, kind: EngineKind) -> EngineConfig:
    from tracetune.cli.engine_options import resolve_engine_config

    with console.status("preparing model…"):
        return resolve_engine_config(args, _progress, kind)


def engine_command(args: argparse.Namespace, console: Console = console) -> int:
    from tracetune.cli.engine_options import chosen_engine
    from tracetune.errors import InputError

    kind = chosen_engine(args)
    if kind.command is None:
        raise InputError(f"{kind.shown} runs no command of tracetune's")
    config = _config_from(args, kind)
    platform = kind.platform()
    argv, env = kind.command(config, platform, port=args.port)
    console.print(f"# platform: {platform.value}", highlight=False)
    print(" ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())) + " \\")
    print("  " + shlex.join(argv))
    return 0


def _default_check_prompt() -> str:
    from tracetune.replay.synth import load_corpus_text

    # Real text (the first ShareGPT prompts of the bundled corpus), cut at a paragraph break.
    text = load_corpus_text()[:1400].rsplit("\n", 1)[0]
    return f"{text}\n\nIn two sentences, what are the requests above about?"


def _shorten(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None or math.isnan(seconds) else f"{seconds * 1000:.1f} ms"


def engine_check(args: argparse.Namespace, console: Console = console) -> int:
    from tracetune.cli.engine_options import chosen_engine
    from tracetune.engine_adapter.openai_client import new_session
    from tracetune.errors import EngineError
    from tracetune.files import refuse_overwrite, write_atomic

    if args.json:  # refused before minutes of engine start, not after
        refuse_overwrite(args.json, flag="--json")
    kind = chosen_engine(args)
    config = _config_from(args, kind)
    prompt = args.prompt or _default_check_prompt()
    platform = kind.platform()
    server, settings = kind.make(args.run_dir, platform=platform), config.model_dump()
    console.print(f"platform: [bold]{platform.value}[/]   model: [bold]{settings['model']}[/]")
    results = []
    try:
        t0 = time.perf_counter()
        with console.status(f"starting {kind.shown}…") as status:
            mode = "" if "enforce_eager" not in settings else " (eager)" if settings["enforce_eager"] else " (compiled)"
            server.launch(config, args.start_timeout, on_tick=lambda elapsed: status.update(
                f"starting {kind.shown}{mode}… {elapsed:.0f}s · log: {server.log_path}"))
        console.print(f"engine log: {server.log_path}")
        startup_s = time.perf_counter() - t0
        console.print(f"healthy after [bold]{startup_s:.1f}s[/]")
        before = server.metrics()

        async def run_all():
            async with new_session(timeout_s=600.0) as client:
                for i in range(args.repeat):
                    console.print(f"\n[bold]request {i + 1}/{args.repeat}[/] > {escape(_shorten(prompt))}")
                    out = await server.stream(
                        client, messages=[{"role": "user", "content": prompt}],
                        max_tokens=args.max_tokens,
                        on_text=lambda piece: console.print(piece, end="", highlight=False, markup=False),
                    )
                    console.print()
                    if not out.success:
                        raise EngineError(f"request failed: {out.error}", log_tail=server.log_tail())
                    results.append(out)

        asyncio.run(run_all())
        delta = server.metrics().delta(before)
        phases = server.start_phases()
    finally:
        server.stop()

    table = Table(title="engine check", show_lines=False)
    for col in ("request", "TTFT", "mean ITL", "E2E", "prompt tok", "output tok", "output tok/s"):
        table.add_column(col, justify="right")
    for i, r in enumerate(results, 1):
        itl = statistics.fmean(r.itl_s) if r.itl_s else None
        tps = (r.output_tokens or 0) / r.e2e_s if r.e2e_s else 0.0
        table.add_row(str(i), _ms(r.ttft_s), _ms(itl), _ms(r.e2e_s), str(r.prompt_tokens),
                      str(r.output_tokens), f"{tps:.1f}")
    console.print(table)
    counters = delta.as_dict()
    console.print(
        f"startup {startup_s:.1f}s · prefix cache hits/queries {counters['prefix_cache_hits']:.0f}/"
        f"{counters['prefix_cache_queries']:.0f} · spec-decode accepted/draft tokens "
        f"{counters['spec_decode_accepted_tokens']:.0f}/{counters['spec_decode_draft_tokens']:.0f} · "
        f"preemptions {counters['preemptions']:.0f}"
    )
    if any(v is not None for v in phases.values()):
        console.print("start: " + " · ".join(
            f"{name.removesuffix('_s').replace('_', ' ')} {value:.1f}s" if isinstance(value, float)
            else f"{name.replace('_', ' ')} {value}" for name, value in phases.items() if value is not None))
    if args.json:
        write_atomic(args.json, json.dumps({
            "config": json.loads(config.model_dump_json()), "platform": platform.value, "startup_s": startup_s,
            "start_phases": phases,
            "requests": [{
                "ttft_s": r.ttft_s, "e2e_s": r.e2e_s, "itl_s": r.itl_s, "text": r.text,
                "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens,
            } for r in results],
            "engine_counters": counters,
        }, indent=2, default=str))
        console.print(f"wrote {args.json}")
    return 0
