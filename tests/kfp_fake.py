"""HTTP servers on 127.0.0.1 for `chexflow submit` tests: FakeKfpApi, a recorded-request FAKE
of the few Kubeflow Pipelines API endpoints kfp's client calls to submit a run (healthz, list and
create experiment, create run), answered as kfp_server_api's models expect; and NotKfp, a
server that answers HTTP but is not the KFP API. No KFP API server can run here (its backend is
not available as a Go module), so what the real API does with a run is not checked."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class _Server:
    """A ThreadingHTTPServer on a free port of 127.0.0.1, serving until close()."""

    handler: type[BaseHTTPRequestHandler]

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict | None]] = []  # method, path, JSON body
        outer = self

        class Handler(self.handler):  # type: ignore[misc, valid-type]
            server_state = outer

            def log_message(self, *args) -> None:  # quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _KfpHandler(BaseHTTPRequestHandler):
    server_state: FakeKfpApi

    def _answer(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> tuple[str, dict | None]:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        path = urlsplit(self.path).path
        self.server_state.requests.append((self.command, self.path, body))
        return path, body

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path, _ = self._record()
        if path == "/apis/v2beta1/healthz":
            self._answer(200, {"multi_user": True, "pipeline_store": "database"})
        elif path == "/apis/v2beta1/experiments":
            self._answer(200, {"experiments": [], "total_size": 0})
        else:
            self._answer(404, {"error": f"no route {path}", "code": 5})

    def do_POST(self) -> None:  # noqa: N802
        path, body = self._record()
        if path == "/apis/v2beta1/experiments":
            self._answer(200, {**body, "experiment_id": "e-1"})
        elif path == "/apis/v2beta1/runs":
            self._answer(200, {**body, "run_id": "r-1", "state": "PENDING"})
        else:
            self._answer(404, {"error": f"no route {path}", "code": 5})


class FakeKfpApi(_Server):
    """The KFP API's healthz, experiments and runs endpoints; every request is recorded."""

    handler = _KfpHandler

    def posted(self, path: str) -> list[dict]:
        return [body for method, p, body in self.requests if method == "POST" and p == path]


class _HtmlHandler(BaseHTTPRequestHandler):
    server_state: NotKfp

    def do_GET(self) -> None:  # noqa: N802
        self.server_state.requests.append(("GET", self.path, None))
        data = b"<html><body>a web page</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class NotKfp(_Server):
    """A web server answering every GET with an HTML page (200): HTTP, but not the KFP API."""

    handler = _HtmlHandler
