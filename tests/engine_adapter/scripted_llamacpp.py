"""A scripted stand-in for llama-server in the engine contract tests: no model, fixed answers.

python scripted_llamacpp.py --port PORT [--alias NAME] [--parallel N] [other llama-server flags, ignored]

Serves /health, /props, /slots, POST /slots/{id}?action=erase, streaming /v1/completions (one event
per token, then the finish reason and usage, then [DONE]) and llamacpp-named /metrics counters that
move with what it served; stops on SIGTERM. Its log says what tracetune's checks read of a real one.
"""

import argparse
import http.server
import json
import signal
import threading

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--alias", default="scripted")
parser.add_argument("--parallel", type=int, default=4)
args, _ = parser.parse_known_args()
served = {"prompt": 0, "generation": 0, "erased": 0}
lock = threading.Lock()
print(f"scripted llama-server on port {args.port}", flush=True)
print("llama_context: n_ctx                 = 8192", flush=True)


class Handler(http.server.BaseHTTPRequestHandler):
    def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        slots = [{"id": i, "n_ctx": 8192, "speculative": False, "is_processing": False} for i in range(args.parallel)]
        if self.path == "/health":
            self._send(200, b"{}")
        elif self.path == "/props":
            self._send(200, json.dumps({"total_slots": args.parallel, "model_alias": args.alias,
                                        "model_ftype": "F16"}).encode())
        elif self.path == "/slots":
            self._send(200, json.dumps(slots).encode())
        elif self.path == "/metrics":
            with lock:
                text = (f"llamacpp:prompt_tokens_total {served['prompt']}\nllamacpp:prompt_tokens_cached_total 0\n"
                        f"llamacpp:tokens_predicted_total {served['generation']}\n"
                        f"llamacpp:requests_processing 0\nllamacpp:requests_deferred 0\n")
            self._send(200, text.encode(), "text/plain; version=0.0.4")
        else:
            self._send(404, b"{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path.startswith("/slots/") and self.path.endswith("?action=erase"):
            with lock:
                served["erased"] += 1
            self._send(200, json.dumps({"id_slot": int(self.path[7:].split("?")[0]), "n_erased": 0}).encode())
            return
        if self.path != "/v1/completions":
            self._send(404, b"{}")
            return
        tokens, prompt_tokens = int(body.get("max_tokens", 8)), len(str(body.get("prompt", "")).split())
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()  # HTTP/1.0: the body ends when the connection closes
        for i in range(tokens):
            chunk = {"choices": [{"index": 0, "text": f"t{i} ", "finish_reason": None}]}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens, "total_tokens": prompt_tokens + tokens}
        last = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": usage}
        self.wfile.write(b"data: " + json.dumps(last).encode() + b"\n\ndata: [DONE]\n\n")
        with lock:
            served["prompt"] += prompt_tokens
            served["generation"] += tokens

    def log_message(self, *a):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
signal.signal(signal.SIGTERM, lambda *a: (threading.Thread(target=server.shutdown).start()))
server.serve_forever()
print("scripted llama-server stopped", flush=True)
