"""`tune record`'s command line: its parser, the --listen and --upstream values, and the command end to
end in a child process (the proxy itself: tests/replay/test_record.py)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

import pytest

from tests.replay.test_record import Upstream
from tracetune.cli.record import add_parser as add_record_parser
from tracetune.engine_adapter.openai_client import new_session, stream_completion
from tracetune.errors import InputError
from tracetune.replay.record import parse_listen, parse_upstream
from tracetune.replay.trace import load_trace

ROOT = Path(__file__).resolve().parents[2]


def parser():
    p = argparse.ArgumentParser(prog="tune")
    add_record_parser(p.add_subparsers(dest="command"))
    return p


def test_parser_defaults_and_help():
    args = parser().parse_args(["record", "--upstream", "http://h:8000", "--out", "t.jsonl"])
    assert args.listen == "127.0.0.1:8100" and args.out == Path("t.jsonl") and not args.record_response
    assert parse_listen(args.listen) == ("127.0.0.1", 8100)
    assert parse_listen("9000") == ("127.0.0.1", 9000)
    assert parse_listen(":9000") == ("127.0.0.1", 9000)
    assert parse_listen("0.0.0.0:9000") == ("0.0.0.0", 9000)
    assert parse_listen("[::1]:9000") == ("::1", 9000)
    sub = parser()._subparsers._group_actions[0].choices["record"]
    assert "examples:" in sub.format_help() and "tune record --upstream" in sub.format_help()


@pytest.mark.parametrize("value", ["host:port", "127.0.0.1:70000", "", "127.0.0.1:-1"])
def test_bad_listen_names_the_flag(value):
    with pytest.raises(InputError, match="--listen"):
        parse_listen(value)


def test_upstream_urls():
    assert parse_upstream("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    assert parse_upstream("https://h/v1") == "https://h"
    assert parse_upstream("http://h:8000/gateway/v1/") == "http://h:8000/gateway"
    for bad in ["127.0.0.1:8000", "ftp://h", "http://", "http://h:x", "http://u:p@h", "http://h?a=1"]:
        with pytest.raises(InputError, match="--upstream"):
            parse_upstream(bad)


def test_record_command_runs_until_sigint_and_prints_a_summary(tmp_path):
    """The command end to end in a child process: record one request, Ctrl-C, summary, exit 0."""
    out = tmp_path / "t.jsonl"
    driver = (
        "import argparse, sys\n"
        "from rich.console import Console\n"
        "from tracetune.cli.record import add_parser as add_record_parser, record_command\n"
        "p = argparse.ArgumentParser(); add_record_parser(p.add_subparsers(dest='command'))\n"
        "sys.exit(record_command(p.parse_args(sys.argv[1:]), Console(width=300)))\n"
    )

    async def go():
        upstream = Upstream()
        await upstream.start()
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", driver, "record", "--upstream", upstream.base_url, "--listen", "127.0.0.1:0",
            "--out", str(out), cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        try:
            first = (await asyncio.wait_for(child.stdout.readline(), 60)).decode()
            assert first.startswith("recording http://127.0.0.1:"), first
            base_url = first.split()[1]
            async with new_session(timeout_s=30) as session:
                result = await stream_completion(session, base_url, model="m", prompt="p", max_tokens=2)
            child.send_signal(signal.SIGINT)
            rest = (await asyncio.wait_for(child.stdout.read(), 60)).decode()
            code = await child.wait()
        finally:
            if child.returncode is None:
                child.kill()
            await upstream.stop()
        return result, rest, code

    result, rest, code = asyncio.run(go())
    assert result.success
    assert code == 0, rest
    assert "recorded 1 requests" in rest and "errors 0" in rest and "added latency p50" in rest
    assert [r.prompt for r in load_trace(out).records] == ["p"]
