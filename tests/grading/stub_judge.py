"""A stub OpenAI-compatible chat server on 127.0.0.1 that judges like a lenient grader:
YES when the reference appears in the candidate (case-insensitive), or in the released
reply format `Judgement: 1` / `Judgement: 0` (`reply_format`). Scripted failures ("error":
HTTP 500, "garbage": bad JSON, "slow") come first. With `api_key` set, a request without that
bearer token gets HTTP 401."""

import contextlib
import http.server
import json
import threading
import time


class StubChatServer(http.server.ThreadingHTTPServer):
    """Answers YES when the reference appears in the candidate; scripted failures come first."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), StubChatHandler)
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.failures: list[str] = []  # "error" (HTTP 500), "garbage" (bad JSON) or "slow"
        self.reply_format = "word"  # "word" (YES / NO) or "judgement" (Judgement: 1 / Judgement: 0)
        self.slow_seconds = 2.0
        self.in_flight = 0
        self.max_in_flight = 0
        self.api_key: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class StubChatHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        server: StubChatServer = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with server.lock:
            server.requests.append({"path": self.path, "body": body, "authorization": self.headers["Authorization"]})
            failure = server.failures.pop(0) if server.failures else None
            server.in_flight += 1
            server.max_in_flight = max(server.max_in_flight, server.in_flight)
        try:
            time.sleep(0.05)
            if failure == "slow":
                time.sleep(server.slow_seconds)
            if server.api_key is not None and self.headers["Authorization"] != f"Bearer {server.api_key}":
                self.send_response(401)
                self.end_headers()
                return
            if failure == "error":
                self.send_response(500)
                self.end_headers()
                self.wfile.write(b"overloaded")
                return
            prompt = body["messages"][-1]["content"]
            reference = prompt.rsplit("Reference answer: ")[-1].split("\n")[0]
            candidate = prompt.rsplit("Model answer: ")[-1].split("\n")[0]
            agrees = reference.lower() in candidate.lower()
            if server.reply_format == "judgement":
                verdict = f"Judgement: {int(agrees)}"
            else:
                verdict = "YES" if agrees else "NO"
            payload = (
                b"{not json"
                if failure == "garbage"
                else json.dumps({"choices": [{"message": {"role": "assistant", "content": verdict}}]}).encode()
            )
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with server.lock:
                server.in_flight -= 1


@contextlib.contextmanager
def running_stub():
    """A StubChatServer serving on a thread until the block ends."""
    stub = StubChatServer()
    thread = threading.Thread(target=stub.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        stub.shutdown()
        stub.server_close()
        thread.join(timeout=5)
