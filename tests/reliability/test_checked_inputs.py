"""Inputs the command line used to accept and fail on late (or with a traceback), now refused through the
real CLI before anything starts: a --gguf that is not a GGUF file (missing, empty, a folder, other
bytes, the trace itself), --gguf with --weights, a --ctx-size past what the model's slots can use, a
search space whose choices mix kinds, an endpoint whose /v1/models answers HTML, a zero, empty or
doubled --slo, and a --precision the capacity search could never reach. Each: exit 2, one line naming
the flag or the file and field, no traceback, no file written, no engine started."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

TRACE = "".join(json.dumps({"timestamp": i * 0.1, "prompt": f"p{i}", "output_length": 2}) + "\n" for i in range(4))
TRAINED = 8192  # the fake model's max_position_embeddings
MAIN = ["--trace", "t.jsonl", "--model", "model", "--run-dir", "run", "--trials", "1"]
CHECK = ["engine", "check", "--engine", "llamacpp", "--model", "model"]


def run_tune(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "400", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "tracetune", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def folder(tmp_path) -> Path:
    """A trace, a model folder whose config states its trained context, and a GGUF file."""
    import gguf

    (tmp_path / "t.jsonl").write_text(TRACE)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": TRAINED}))
    (model / "model.safetensors").write_bytes(b"")
    (model / "tokenizer.json").write_text("{}")
    writer = gguf.GGUFWriter(str(tmp_path / "good.gguf"), "llama")
    writer.add_context_length(2048)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tmp_path


def refused(out: subprocess.CompletedProcess, folder: Path, before: set[str], says: str) -> None:
    """Exit 2, `says` on the last line of stderr, no traceback, nothing started or written."""
    both = out.stdout + out.stderr
    assert out.returncode == 2, both
    assert "Traceback" not in both and "healthy" not in both and "starting" not in both, both
    last = out.stderr.strip().splitlines()[-1]
    assert says in last, f"{says!r} not in {last!r}"
    assert {p.name for p in folder.iterdir()} == before, "files written"


def names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


# --- --gguf ------------------------------------------------------------------------------------------

NOT_GGUF = [("missing.gguf", None, "no such file; name a .gguf file, or leave --gguf out"),
            ("folder", "dir", "is a folder, not a GGUF file"), ("empty.gguf", b"", "is empty, not a GGUF file"),
            ("notagguf", b"<html>not weights</html>", "not a GGUF file (it starts with b'<htm', not b'GGUF')")]


@pytest.mark.parametrize(("name", "content", "says"), NOT_GGUF, ids=[n for n, _, _ in NOT_GGUF])
def test_engine_check_refuses_a_gguf_that_is_not_one(folder, name, content, says):
    if content == "dir":
        (folder / name).mkdir()
    elif content is not None:
        (folder / name).write_bytes(content)
    before = names(folder)
    refused(run_tune([*CHECK, "--gguf", name], folder), folder, before, f"error: --gguf {name}: {says}")


def test_the_main_job_refuses_a_bad_gguf_before_its_run_folder(folder):
    (folder / "notagguf").write_text("text")
    before = names(folder)
    out = run_tune([*MAIN, "--engine", "llamacpp", "--gguf", "notagguf"], folder)
    refused(out, folder, before, "--gguf notagguf: not a GGUF file (it starts with b'text', not b'GGUF')")


def test_the_trace_as_gguf_is_named_as_the_trace(folder):
    before = names(folder)
    out = run_tune(["replay", "--trace", "t.jsonl", "--engine", "llamacpp", "--model", "model", "--gguf",
                    "t.jsonl", "--out", "out"], folder)
    refused(out, folder, before, "--gguf t.jsonl: is the trace file (--trace t.jsonl)")


def test_gguf_with_weights_is_a_contradiction(folder):
    before = names(folder)
    out = run_tune([*CHECK, "--gguf", "good.gguf", "--weights", "Q8_0"], folder)
    refused(out, folder, before, "--gguf good.gguf and --weights Q8_0 contradict: --gguf serves that file as it "
                                 "is, --weights makes Q8_0 weights from --model; give one")


# --- --ctx-size --------------------------------------------------------------------------------------

def test_a_context_past_the_models_slots_is_refused(folder):
    before = names(folder)
    out = run_tune([*CHECK, "--ctx-size", "99999999999"], folder)
    refused(out, folder, before, f"--ctx-size 99999999999: over what the slots can use, {TRAINED * 4} tokens: "
                                 f"{TRAINED} a slot, the model's trained context (max_position_embeddings in ")
    out = run_tune([*MAIN, "--engine", "llamacpp", "--gguf", "good.gguf", "--parallel", "2", "--ctx-size", "4097"],
                   folder)  # the GGUF served states its own context
    refused(out, folder, before, "--ctx-size 4097: over what the slots can use, 4096 tokens: 2048 a slot, the "
                                 "model's trained context (llama.context_length in good.gguf), x --parallel 2")


# --- a search space's choices --------------------------------------------------------------------------

def test_choices_of_several_kinds_are_refused_with_file_line_and_field(folder):
    (folder / "mixed.yaml").write_text('name: mixed\nparameters:\n  max_num_seqs: {choices: [4, "many", 8.5]}\n')
    before = names(folder)
    out = run_tune([*MAIN, "--space", "mixed.yaml"], folder)
    refused(out, folder, before, "mixed.yaml:3: field 'parameters.max_num_seqs': Value error, choices must all be "
                                 "of one kind, but 4 is a number and 'many' a string")


# --- an endpoint that is not an OpenAI server --------------------------------------------------------------

@pytest.fixture
def html_server() -> Iterator[str]:
    """A web server answering every GET with a welcome page (a proxy or a web server where the model
    server was meant)."""
    class Welcome(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<!doctype html><html><body>It works!</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Welcome)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join(10)


@pytest.mark.parametrize("command", [["replay"], ["capacity", "--slo", "e2e:p99<1s"]], ids=["replay", "capacity"])
def test_an_endpoint_answering_html_is_named_in_one_line(folder, html_server, command):
    before = names(folder)
    out = run_tune([*command, "--trace", "t.jsonl", "--endpoint", html_server, "--out", "out"], folder)
    refused(out, folder, before, f"--endpoint {html_server}: GET /v1/models answered text/html ('<!doctype html>"
                                 f"<html><body>It works!</body></html>'), not an OpenAI model list")


# --- --slo and --precision -----------------------------------------------------------------------------

FLAGS = [("--slo", "ttft:p99<0s", "argument --slo: the threshold in 'ttft:p99<0s' must be above 0"),
         ("--slo", "", "argument --slo: empty; write e.g. 'ttft:p99<2s,tpot:p99<100ms', or leave --slo out"),
         ("--slo", "ttft:p99<1s,tpot:p99<50ms,ttft:p99<2s",
          "argument --slo: ttft:p99 is bound twice ('ttft:p99<1s' and 'ttft:p99<2s'); keep one"),
         ("--precision", "1e-12", "argument --precision: '1e-12' is below 0.005 (0.5%): a capacity bracket that "
                                  "narrow is inside the noise")]


@pytest.mark.parametrize(("flag", "value", "says"), FLAGS, ids=[f"{f}={v}" for f, v, _ in FLAGS])
def test_the_main_job_refuses_a_meaningless_slo_or_precision(folder, flag, value, says):
    before = names(folder)
    slo = [] if flag == "--slo" else ["--slo", "ttft:p99<2s"]
    refused(run_tune([*MAIN, *slo, flag, value], folder), folder, before, says)
