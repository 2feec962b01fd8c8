"""A stand-in for llama-server's scoring API (/props, /tokenize, /completion, /v1/completions) over
real HTTP, on a toy model: a vocabulary of `VOCAB` tokens whose next-token log-probabilities are a
fixed function of the previous token, optionally shifted (a "quantized" copy)."""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VOCAB = 40


def logprobs(previous: int, shift: float = 0.0) -> list[float]:
    """The toy model's next-token log-probabilities after `previous`."""
    logits = [math.sin(previous * 0.7 + t * 1.3) * 3.0 + shift * math.cos(t * 2.1 + previous) for t in range(VOCAB)]
    top = max(logits)
    total = math.log(sum(math.exp(v - top) for v in logits)) + top
    return [v - total for v in logits]


class FakeLlamaServer:
    """Serves on 127.0.0.1 (`url`) until `close()`; `forced_wrong` answers a forced request with
    another token (a server that cannot score); tokens in `held_back` end in an incomplete UTF-8
character, whose probabilities llama-server never returns; `requests` counts /completion requests."""

    def __init__(self, shift: float = 0.0, slots: int = 2, forced_wrong: bool = False,
                 held_back: frozenset[int] = frozenset()) -> None:
        self.shift, self.slots, self.forced_wrong, self.held_back = shift, slots, forced_wrong, held_back
        self.requests = 0
        self.slots_used: set[object] = set()  # id_slot of every forced request
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def completion(self, body: dict) -> dict:
        self.requests += 1
        prompt = list(body["prompt"])
        if body.get("return_tokens"):  # sampling a continuation: a fixed walk through the vocabulary
            return {"tokens": [(prompt[-1] + 3 * i + 1) % VOCAB for i in range(int(body["n_predict"]))]}
        self.slots_used.add(body.get("id_slot"))
        lp = logprobs(prompt[-1], self.shift)
        ranked = sorted(range(VOCAB), key=lambda t: -lp[t])
        forced = int(body["logit_bias"][0][0]) if body.get("logit_bias") else ranked[0]
        token = (forced + 1) % VOCAB if self.forced_wrong else forced
        if token in self.held_back:
            return {"completion_probabilities": []}
        top = ranked[: int(body["n_probs"])]
        return {"completion_probabilities": [{"id": token, "logprob": lp[token],
                                              "top_logprobs": [{"id": t, "logprob": lp[t]} for t in top]}]}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, data: dict) -> None:
                raw = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                self._send({"total_slots": fake.slots})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/tokenize":
                    self._send({"tokens": [ord(c) % VOCAB for c in body["content"]]})
                elif self.path == "/completion":
                    self._send(fake.completion(body))
                else:  # /v1/completions: a short greedy answer
                    self._send({"choices": [{"text": "blue sky", "token_ids": [1, 2]}]})

        return Handler
