"""`tune record`: the recording proxy (replay.record) run until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

from tracetune.replay.record import DEFAULT_HOST, DEFAULT_PORT, SHUTDOWN_GRACE_S, RecordingProxy, parse_listen

RECORD_EPILOG = f"""\
Point clients at the proxy instead of the server (e.g. base URL
http://127.0.0.1:{DEFAULT_PORT}/v1). Every request is forwarded untouched; completions
and chat completions are also appended to --out as a native trace, in arrival
order. Ctrl-C stops recording and prints a summary.

examples:
  tune record --upstream http://127.0.0.1:8000 --out traffic.jsonl
  tune record --upstream http://gpu-box:8000/v1 --listen 0.0.0.0:{DEFAULT_PORT} --out traffic.jsonl --record-response
  tune replay --trace traffic.jsonl --engine vllm --eager      # then replay what was recorded
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the `record` subcommand to a subparsers object."""
    rp = sub.add_parser(
        "record", help="record live traffic as a trace: a transparent proxy in front of an OpenAI-compatible server",
        epilog=RECORD_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    rp.add_argument("--upstream", required=True, metavar="URL",
                    help="the OpenAI-compatible server to forward to, e.g. http://127.0.0.1:8000 "
                         "(a trailing /v1 is fine)")
    rp.add_argument("--listen", default=f"{DEFAULT_HOST}:{DEFAULT_PORT}", metavar="HOST:PORT",
                    help=f"where clients connect (default {DEFAULT_HOST}:{DEFAULT_PORT}; "
                         f"a bare PORT listens on {DEFAULT_HOST})")
    rp.add_argument("--out", required=True, type=Path, metavar="FILE",
                    help="native JSONL trace to write; must be new or empty (every recording starts its clock at 0)")
    rp.add_argument("--record-response", action="store_true", help="also store each response's output text")



def record_command(args: argparse.Namespace, console) -> int:
    """Run the recording proxy until Ctrl-C or SIGTERM, then print a summary."""
    import asyncio

    host, port = parse_listen(args.listen)
    proxy = RecordingProxy(args.upstream, args.out, record_response=args.record_response)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if stop.is_set():  # a second Ctrl-C: do not wait for in-flight requests
                proxy.hurry()
            stop.set()

        await proxy.start(host, port)
        signals = (signal.SIGINT, signal.SIGTERM)
        for sig in signals:
            loop.add_signal_handler(sig, on_signal)
        try:
            console.print(f"recording {proxy.base_url} → {proxy.upstream} · completions and chat completions "
                          f"go to {args.out} · Ctrl-C to stop", highlight=False)
            with console.status("") as status:
                while not stop.is_set():
                    status.update(f"recorded {proxy.recorded} · errors {proxy.errors} · in flight {proxy.in_flight}")
                    try:
                        await asyncio.wait_for(stop.wait(), 0.5)
                    except TimeoutError:
                        pass
            if proxy.in_flight:
                console.print(f"stopping: waiting up to {SHUTDOWN_GRACE_S:.0f}s for {proxy.in_flight} in-flight "
                              f"requests (Ctrl-C again to cut them off)", highlight=False)
            await proxy.stop()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)

    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())
    console.print(proxy.summary(), highlight=False)
    return 0
