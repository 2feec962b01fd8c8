"""A scripted OpenAI-compatible server for the engine contract tests: no model, fixed answers.

python scripted_openai.py --port PORT [--model NAME]

Serves /health, /v1/models, streaming /v1/completions (one event per token, then the finish
reason and usage, then [DONE]), vLLM-named /metrics counters that move with what it served, and
POST /reset_prefix_cache; stops on SIGTERM.
"""

import argparse
import http.server
import json
import signal
import sys
import threading

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--model", default="scripted")
args, _ = parser.parse_known_args()
served = {"prompt": 0, "generation": 0, "requests": 0, "resets": 0}
lock = threading.Lock()
print(f"scripted OpenAI server on port {args.port}", flush=True)


class Handler(http.server.BaseHTTPRequestHandler):
    def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self._send(200, b"")
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"data": [{"id": args.model}]}).encode())
        elif self.path == "/metrics":
            with lock:
                text = (f"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
                        f"vllm:prompt_tokens_total {served['prompt']}\nvllm:generation_tokens_total {served['generation']}\n"
                        f"vllm:request_success_total {served['requests']}\n")
            self._send(200, text.encode(), "text/plain; version=0.0.4")
        else:
            self._send(404, b"{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/reset_prefix_cache":
            with lock:
                served["resets"] += 1
            self._send(200, b"")
            return
        if self.path != "/v1/completions":
            self._send(404, b"{}")
            return
        tokens, prompt_tokens = int(body.get("max_tokens", 8)), len(str(body.get("prompt", "")).split())
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()  # HTTP/1.0: the body ends when the connection closes
        for i in range(tokens):
            self.wfile.write(b"data: " + json.dumps({"choices": [{"index": 0, "text": f"t{i} ", "finish_reason": None}]}).encode() + b"\n\n")
            self.wfile.flush()
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens, "total_tokens": prompt_tokens + tokens}
        self.wfile.write(b"data: " + json.dumps({"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                                                  "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n")
        with lock:
            served["prompt"] += prompt_tokens
            served["generation"] += tokens
            served["requests"] += 1

    def log_message(self, *a):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
signal.signal(signal.SIGTERM, lambda *a: (threading.Thread(target=server.shutdown).start()))
server.serve_forever()
print("scripted OpenAI server stopped", flush=True)
sys.exit(0)
