"""The demo's stand-in schema registry: one schema, served over HTTP as Confluent's REST API
gives it, so that `kvproxy demo` can show the `schema` policy's refusals with no registry
installed. Not a schema registry: it answers the proxy's lookups and nothing else."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["DemoSchema", "serve_demo_registry"]


@dataclass(frozen=True, slots=True)
class DemoSchema:
    """The one schema the stand-in holds: its id, the subject it is registered under, its text."""

    schema_id: int
    subject: str
    schema: str


def _handler(schema: DemoSchema) -> type[http.server.BaseHTTPRequestHandler]:
    answers: dict[str, object] = {
        "/subjects": [schema.subject],
        f"/schemas/ids/{schema.schema_id}": {"schemaType": "AVRO", "schema": schema.schema},
        f"/schemas/ids/{schema.schema_id}/versions": [{"subject": schema.subject, "version": 1}],
    }

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in answers:
                self._send(200, answers[path])
            elif path.startswith("/schemas/ids/"):
                number = path.removeprefix("/schemas/ids/").split("/", 1)[0]
                self._send(404, {"error_code": 40403, "message": f"Schema {number} not found"})
            else:
                self._send(404, {"error_code": 404, "message": "HTTP 404 Not Found"})

        def _send(self, status: int, value: object) -> None:
            body = json.dumps(value).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Silent: the demo prints what matters itself."""

    return Handler


@contextlib.contextmanager
def serve_demo_registry(schema: DemoSchema) -> Iterator[str]:
    """The stand-in on a free loopback port, for the duration of the block; yields its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(schema))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="demo-registry", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
