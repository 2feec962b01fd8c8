"""A stand-in server process for lifecycle tests of ServerProcess (not an engine).

python fake_server.py PORT MODE   MODE: healthy | exit3 | never | stubborn | spawning
`spawning` ignores SIGTERM and starts children without pause, as a server starting its workers
does: a single sweep of its process group always misses the newest ones.
It starts a grandchild (`sleep`) in its own process group first, as vLLM starts engine workers.
"""

import http.server
import signal
import subprocess
import sys
import threading
import time

port, mode = int(sys.argv[1]), sys.argv[2]
subprocess.Popen(["sleep", "300"])
print("fake server starting", flush=True)
if mode == "exit3":
    print("boom: bad flag --frobnicate", flush=True)
    sys.exit(3)
if mode == "never":
    time.sleep(300)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, lambda *a: print("ignoring SIGTERM", flush=True))
if mode == "spawning":
    signal.signal(signal.SIGTERM, lambda *a: None)

    def spawn_forever():
        while True:
            subprocess.Popen(["sleep", "300"])

    threading.Thread(target=spawn_forever, daemon=True).start()


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
