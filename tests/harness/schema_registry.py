"""A test registry on loopback that stands in for Confluent Schema Registry's REST API.

No real Schema Registry can run here, so tests of the proxy's registry lookups talk to this one. It
stands in for the real service; the wire contract is Confluent's documented one (paths, JSON
bodies, the ``application/vnd.schemaregistry.v1+json`` content type, ``{"error_code", "message"}``
error bodies with the matching HTTP status), and it is checked against confluent-kafka's own
``SchemaRegistryClient`` and its Avro, JSON Schema and Protobuf serializers in
``tests/integration/test_schema_registry_stub.py``.

Usage::

    with TestRegistry() as registry:              # or TestRegistry(...).start() / .stop()
        registry.url                              # "http://127.0.0.1:PORT" (https with tls=)
        schema_id = registry.register("orders-value", avro_text)     # no HTTP
        registry.fail = "down"                    # or None, "hangup", "slow", "error500", "garbage"
        registry.requests                         # [("GET", "/schemas/ids/1?subject=..."), ...]
        registry.count("/schemas/ids/1")          # requests to that path (query ignored)
        gate = registry.gate(1)                   # hold every request about id 1 ...
        gate.set()                                # ... until this; registry.aborted: given up

Endpoints (anything else answers 404 ``{"error_code": 404, "message": "HTTP 404 Not Found"}``):

* ``POST /subjects/{s}/versions``: register; answers ``{"id": n}``. The same text, type and
  references get the same id in every subject; a schema already under the subject keeps its
  version; a new one gets the next version. Invalid Avro/JSON text or a reference to an unknown
  subject/version: 422/42201.
* ``POST /subjects/{s}``: lookup; 40401 unknown subject, 40403 schema not under it.
* ``GET /schemas/ids/{id}``, ``.../versions``, ``.../subjects``; ``GET /schemas/types``.
* ``GET /subjects``, ``GET /subjects/{s}/versions``, ``GET /subjects/{s}/versions/{v|latest}``,
  ``.../referencedby``; ``DELETE /subjects/{s}``.
* ``GET /config`` (BACKWARD), ``GET /config/{s}`` (40408 unless ``defaultToGlobal=true``),
  ``GET /mode`` (READWRITE), ``GET /`` (``{}``).
* ``GET /associations/resources/{namespace}/{name}``: ``[]``. confluent-kafka 2.16's default
  subject name strategy asks this before every first use of a topic; with no association it
  falls back to ``{topic}-value`` / ``{topic}-key`` (it treats a 404 the same way).

Answers leave out ``schemaType`` for AVRO and ``references`` when there are none, as Confluent's do.
Query parameters the real service takes (``normalize``, ``deleted``, ``format``, ``subject``,
``offset``, ``limit``) are accepted and, but for ``subjectPrefix`` and ``defaultToGlobal``,
ignored.

What it leaves out, knowingly: compatibility checks, contexts, soft deletes (``DELETE`` removes
the subject; its ids stay readable, as they do in the real service), schema normalisation (two
schemas are the same only when text, type and references are equal), and Protobuf rendering: a
schema is answered exactly as it was posted, whatever ``format=`` asks for (the Python
``ProtobufSerializer`` posts a base64 ``FileDescriptorProto``, which is what ``format=serialized``
gives back from the real service too).

Failure modes (``registry.fail``, settable while running):

* ``"down"``: the listening socket is closed and open connections are shut, so a client gets
  "connection refused"; setting ``fail`` back listens again on the same port.
* ``"hangup"``: connections are accepted, the request is read and logged, and the connection is
  closed with no answer.
* ``"slow"``: every answer waits ``registry.slow_s`` seconds first.
* ``"error500"``: HTTP 500 ``{"error_code": 50001, ...}``.
* ``"garbage"``: HTTP 200 with the registry's content type and a body that is not JSON.

A gate (``registry.gate(schema_id)``, a ``threading.Event``) holds every request about one id
(``/schemas/ids/{id}`` and ``/schemas/ids/{id}/versions``) after it is logged, until the event
is set: a registry slow for that id only, as long as a test wants. A client that closes its
connection while its request is held is noted in ``registry.aborted`` (the path, with query) and
gets no answer.

``error500`` is retriable for confluent-kafka's client (as are connection errors): give it
``"max.retries": 0`` in tests, or it waits about a second per retry.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import select
import socket
import ssl
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal, get_args
from urllib.parse import parse_qs, unquote, urlsplit

from tests.harness.tls import TlsFiles

__all__ = [
    "CONTENT_TYPE",
    "FailMode",
    "Reference",
    "RegistryError",
    "StoredSchema",
    "TestRegistry",
]

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"

FailMode = Literal["down", "hangup", "slow", "error500", "garbage"]
_FAIL_MODES: tuple[str, ...] = get_args(FailMode)
_SCHEMA_TYPES = ("AVRO", "JSON", "PROTOBUF")
_MAX_VERSION = 2**31 - 1
_ID_PATH = re.compile(r"/schemas/ids/(\d+)(?:/versions)?")


@dataclass(frozen=True)
class Reference:
    """A schema reference as Confluent names it: the import name, and where the schema lives."""

    name: str
    subject: str
    version: int

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "subject": self.subject, "version": self.version}


@dataclass(frozen=True)
class StoredSchema:
    """What identifies a schema here: its text exactly as posted, its type and its references."""

    schema: str
    schema_type: str = "AVRO"
    references: tuple[Reference, ...] = ()

    def as_json(self) -> dict[str, Any]:
        """The schema fields of an answer: ``schemaType`` left out for AVRO, as Confluent does."""
        out: dict[str, Any] = {"schema": self.schema}
        if self.schema_type != "AVRO":
            out["schemaType"] = self.schema_type
        if self.references:
            out["references"] = [ref.as_json() for ref in self.references]
        return out


class RegistryError(Exception):
    """A Confluent error answer: HTTP status and ``{"error_code", "message"}``."""

    def __init__(self, status: int, error_code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code
        self.message = message


def _subject_not_found(subject: str) -> RegistryError:
    return RegistryError(404, 40401, f"Subject '{subject}' not found.")


def _schema_id_not_found(schema_id: int) -> RegistryError:
    return RegistryError(404, 40403, f"Schema {schema_id} not found")


_NOT_FOUND = RegistryError(404, 404, "HTTP 404 Not Found")


@dataclass
class _Store:
    """The registry's contents; every method runs under ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    ids: dict[StoredSchema, int] = field(default_factory=dict)
    schemas: dict[int, StoredSchema] = field(default_factory=dict)
    subjects: dict[str, list[int]] = field(default_factory=dict)  # version n is [n - 1]

    def register(self, subject: str, schema: StoredSchema) -> tuple[int, int]:
        """(id, version) of ``schema`` under ``subject``, registering it if new."""
        with self.lock:
            self._check(schema)
            versions = self.subjects.get(subject, [])
            schema_id = self.ids.get(schema)
            if schema_id is not None and schema_id in versions:
                return schema_id, versions.index(schema_id) + 1
            if schema_id is None:
                schema_id = max(self.schemas, default=0) + 1
                self.ids[schema] = schema_id
                self.schemas[schema_id] = schema
            versions.append(schema_id)
            self.subjects[subject] = versions
            return schema_id, len(versions)

    def lookup(self, subject: str, schema: StoredSchema) -> tuple[int, int]:
        with self.lock:
            versions = self.subjects.get(subject)
            if versions is None:
                raise _subject_not_found(subject)
            schema_id = self.ids.get(schema)
            if schema_id is None or schema_id not in versions:
                raise RegistryError(404, 40403, "Schema not found")
            return schema_id, versions.index(schema_id) + 1

    def by_id(self, schema_id: int) -> StoredSchema:
        with self.lock:
            if schema_id not in self.schemas:
                raise _schema_id_not_found(schema_id)
            return self.schemas[schema_id]

    def versions_of_id(self, schema_id: int) -> list[tuple[str, int]]:
        with self.lock:
            if schema_id not in self.schemas:
                raise _schema_id_not_found(schema_id)
            return [
                (subject, versions.index(schema_id) + 1)
                for subject, versions in sorted(self.subjects.items())
                if schema_id in versions
            ]

    def versions(self, subject: str) -> list[int]:
        with self.lock:
            if subject not in self.subjects:
                raise _subject_not_found(subject)
            return list(range(1, len(self.subjects[subject]) + 1))

    def version(self, subject: str, version: str) -> tuple[int, int, StoredSchema]:
        """(version, id, schema) of ``version`` (a number or ``latest``) under ``subject``."""
        number = _parse_version(version)
        with self.lock:
            versions = self.subjects.get(subject)
            if versions is None:
                raise _subject_not_found(subject)
            if number is None:
                number = len(versions)
            if not 1 <= number <= len(versions):
                raise RegistryError(404, 40402, f"Version {number} not found.")
            schema_id = versions[number - 1]
            return number, schema_id, self.schemas[schema_id]

    def referenced_by(self, subject: str, version: str) -> list[int]:
        number, _, _ = self.version(subject, version)
        with self.lock:
            return sorted(
                schema_id
                for schema_id, schema in self.schemas.items()
                if any(
                    ref.subject == subject and ref.version == number for ref in schema.references
                )
            )

    def delete_subject(self, subject: str) -> list[int]:
        with self.lock:
            if subject not in self.subjects:
                raise _subject_not_found(subject)
            return list(range(1, len(self.subjects.pop(subject)) + 1))

    def _check(self, schema: StoredSchema) -> None:
        """Refuse what the real service refuses as 42201: unknown type, bad text, missing refs."""
        if schema.schema_type not in _SCHEMA_TYPES:
            raise RegistryError(422, 42201, f"Invalid schema type {schema.schema_type}")
        for ref in schema.references:
            versions = self.subjects.get(ref.subject, [])
            if not 1 <= ref.version <= len(versions):
                raise RegistryError(
                    422,
                    42201,
                    f"Invalid schema: reference {ref.name!r} to {ref.subject} version "
                    f"{ref.version}, which does not exist",
                )
        if schema.schema_type == "PROTOBUF":
            return
        try:
            parsed = json.loads(schema.schema)
        except ValueError as exc:
            raise RegistryError(422, 42201, f"Invalid schema: {exc}") from exc
        if schema.schema_type == "AVRO":
            self._check_avro(parsed, schema.references)

    def _check_avro(self, parsed: Any, references: tuple[Reference, ...]) -> None:
        import fastavro

        named: dict[str, Any] = {}
        for ref_parsed in self._avro_references(references, set()):
            fastavro.parse_schema(ref_parsed, named_schemas=named)
        try:
            fastavro.parse_schema(parsed, named_schemas=named)
        except Exception as exc:  # fastavro raises several kinds for a bad schema
            raise RegistryError(422, 42201, f"Invalid schema: {exc}") from exc

    def _avro_references(self, references: Iterable[Reference], seen: set[int]) -> Iterator[Any]:
        """The referenced Avro schemas, parsed, those they reference first."""
        for ref in references:
            schema_id = self.subjects[ref.subject][ref.version - 1]
            if schema_id in seen:
                continue
            seen.add(schema_id)
            stored = self.schemas[schema_id]
            yield from self._avro_references(stored.references, seen)
            yield json.loads(stored.schema)


def _parse_version(text: str) -> int | None:
    """A version number, or None for ``latest``; 42202 for anything else, as Confluent answers."""
    if text == "latest":
        return None
    try:
        number = int(text)
    except ValueError:
        number = 0
    if not 1 <= number <= _MAX_VERSION:
        raise RegistryError(
            422,
            42202,
            f"The specified version '{text}' is not a valid version id. Allowed values are "
            f'between [1, 2^31-1] and the string "latest"',
        )
    return number


def _parse_schema_id(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise _NOT_FOUND from None


def _schema_from_body(body: Any) -> StoredSchema:
    if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
        raise RegistryError(422, 42201, "Invalid schema: the request has no 'schema' string")
    try:
        references = tuple(
            Reference(str(ref["name"]), str(ref["subject"]), int(ref["version"]))
            for ref in body.get("references") or ()
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RegistryError(422, 42201, f"Invalid schema: bad reference {exc}") from exc
    return StoredSchema(body["schema"], str(body.get("schemaType") or "AVRO"), references)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # a burst of connections is queued, not dropped (SYN retried 1 s on)
    registry: TestRegistry
    tls_context: ssl.SSLContext | None = None

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = self.socket.accept()
        if self.tls_context is not None:
            # the handshake runs in the connection's thread (setup), not in the accept loop
            sock = self.tls_context.wrap_socket(
                sock, server_side=True, do_handshake_on_connect=False
            )
        return sock, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet: a client that hangs up or fails the TLS handshake is not a test failure."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the real service (Jetty) does
    disable_nagle_algorithm = True  # headers and body go out in separate writes
    server: _Server

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()
        super().setup()
        self.server.registry._connection_opened(self.request)

    def finish(self) -> None:
        self.server.registry._connection_closed(self.request)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the request log is ``registry.requests``."""

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        registry = self.server.registry
        registry._request_started()
        try:
            self._serve_now(method)
        finally:
            registry._request_ended()

    def _serve_now(self, method: str) -> None:
        registry = self.server.registry
        length = int(self.headers.get("Content-Length") or 0)
        raw_body = self.rfile.read(length) if length else b""
        registry._log(method, self.path)
        if self._held_until_client_left():
            return
        fail = registry.fail
        if fail in ("hangup", "down"):
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.request.shutdown(socket.SHUT_RDWR)
            return
        if fail == "slow" and registry._stopping.wait(registry.slow_s):
            return
        if fail == "error500":
            self._answer(500, {"error_code": 50001, "message": "Error in the backend data store"})
            return
        if fail == "garbage":
            self._send(200, b"<html><body>not a registry answer</body></html>")
            return
        if not registry._authorized(self.headers.get("Authorization")):
            self._answer(401, {"error_code": 401, "message": "Unauthorized"}, basic=True)
            return
        try:
            body = json.loads(raw_body) if raw_body else None
        except ValueError:
            self._answer(400, {"error_code": 400, "message": "Unrecognized token in the body"})
            return
        try:
            answer = registry._route(method, self.path, body)
        except RegistryError as exc:
            self._answer(exc.status, {"error_code": exc.error_code, "message": exc.message})
            return
        self._answer(200, answer)

    def _held_until_client_left(self) -> bool:
        """Wait at the gate of the id this request is about, if any; True when the client
        closed its connection meanwhile (or the registry stops): nothing is answered."""
        registry = self.server.registry
        gate = registry._gate_for(self.path)
        if gate is None:
            return False
        while not gate.wait(0.01):
            if registry._stopping.is_set():
                return True
            if self._client_left():
                registry._note_aborted(self.path)
                self.close_connection = True
                return True
        return False

    def _client_left(self) -> bool:
        readable, _, _ = select.select([self.request], [], [], 0)
        if not readable:
            return False
        try:
            return bool(self.request.recv(1, socket.MSG_PEEK) == b"")
        except (OSError, ValueError):  # reset; or a TLS socket, which cannot peek
            return True

    def _answer(self, status: int, payload: Any, *, basic: bool = False) -> None:
        extra = {}
        if basic and self.server.registry.basic_auth is not None:
            extra["WWW-Authenticate"] = 'Basic realm="SchemaRegistry"'
        self._send(status, json.dumps(payload).encode(), extra)

    def _send(self, status: int, body: bytes, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


class TestRegistry:
    """The stand-in registry; see the module docstring for what it answers and how it fails."""

    __test__ = False  # pytest: a helper, not a test class

    def __init__(
        self,
        *,
        basic_auth: tuple[str, str] | None = None,
        bearer_token: str | None = None,
        tls: TlsFiles | None = None,
        slow_s: float = 2.0,
    ) -> None:
        self.basic_auth = basic_auth
        self.bearer_token = bearer_token
        self.tls = tls
        self.slow_s = slow_s
        self.port = 0
        self._store = _Store()
        self._fail: FailMode | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # the request log, connections and the listener
        self._in_flight = 0
        self.most_in_flight = 0
        """The most requests being answered at the same time so far."""
        self._requests: list[tuple[str, str]] = []
        self._connections: set[socket.socket] = set()
        self._stopping = threading.Event()
        self._gates: dict[int, threading.Event] = {}
        self._aborted: list[str] = []

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> TestRegistry:
        """Listen on a free 127.0.0.1 port (the same one again after ``fail = "down"``)."""
        self._stopping.clear()
        with self._lock:
            self._listen()
        return self

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            self._close_listener()
            self._close_connections()

    def __enter__(self) -> TestRegistry:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    # -- failure modes -----------------------------------------------------------------------

    @property
    def fail(self) -> FailMode | None:
        return self._fail

    @fail.setter
    def fail(self, mode: FailMode | None) -> None:
        if mode is not None and mode not in _FAIL_MODES:
            raise ValueError(f"fail must be None or one of {_FAIL_MODES}, not {mode!r}")
        with self._lock:
            self._fail = mode
            if mode == "down":
                self._close_listener()
                self._close_connections()
            elif self._server is None and not self._stopping.is_set():
                self._listen()

    # -- the request log ---------------------------------------------------------------------

    @property
    def requests(self) -> list[tuple[str, str]]:
        """(method, path with query) of every request read so far, oldest first."""
        with self._lock:
            return list(self._requests)

    def _request_started(self) -> None:
        with self._lock:
            self._in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self._in_flight)

    def _request_ended(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def count(self, path: str, method: str | None = None) -> int:
        """How many requests went to ``path`` (compared without the query string)."""
        return sum(
            1
            for seen_method, seen in self.requests
            if urlsplit(seen).path == path and method in (None, seen_method)
        )

    def gate(self, schema_id: int) -> threading.Event:
        """Hold the requests about `schema_id` until the returned event is set (see the
        module docstring); the same event for the same id."""
        with self._lock:
            return self._gates.setdefault(schema_id, threading.Event())

    @property
    def aborted(self) -> list[str]:
        """Paths of held requests whose client closed the connection before an answer."""
        with self._lock:
            return list(self._aborted)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    # -- direct set-up (no HTTP) -------------------------------------------------------------

    def register(
        self,
        subject: str,
        schema: str,
        schema_type: str = "AVRO",
        references: Iterable[Reference] = (),
    ) -> int:
        """Register as ``POST /subjects/{subject}/versions`` would; the schema id."""
        schema_id, _ = self._store.register(
            subject, StoredSchema(schema, schema_type, tuple(references))
        )
        return schema_id

    def latest_version(self, subject: str) -> int:
        return self._store.versions(subject)[-1]

    def delete_subject(self, subject: str) -> list[int]:
        """Remove ``subject`` (its ids stay readable); the versions it had."""
        return self._store.delete_subject(subject)

    # -- internals the handler calls ---------------------------------------------------------

    def _listen(self) -> None:
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.registry = self
        if self.tls is not None:
            server.tls_context = self.tls.server_context()
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"test-registry-{self.port}",
            daemon=True,
        )
        self._thread.start()

    def _close_listener(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join()

    def _close_connections(self) -> None:
        for sock in list(self._connections):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _connection_opened(self, sock: socket.socket) -> None:
        with self._lock:
            self._connections.add(sock)

    def _connection_closed(self, sock: socket.socket) -> None:
        with self._lock:
            self._connections.discard(sock)

    def _gate_for(self, path: str) -> threading.Event | None:
        matched = _ID_PATH.fullmatch(urlsplit(path).path)
        if matched is None:
            return None
        with self._lock:
            return self._gates.get(int(matched.group(1)))

    def _note_aborted(self, path: str) -> None:
        with self._lock:
            self._aborted.append(path)

    def _log(self, method: str, path: str) -> None:
        with self._lock:
            self._requests.append((method, path))

    def _authorized(self, header: str | None) -> bool:
        if self.basic_auth is None and self.bearer_token is None:
            return True
        accepted = []
        if self.basic_auth is not None:
            user, password = self.basic_auth
            accepted.append("Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
        if self.bearer_token is not None:
            accepted.append(f"Bearer {self.bearer_token}")
        return header in accepted

    def _route(self, method: str, path_with_query: str, body: Any) -> Any:
        parts = urlsplit(path_with_query)
        query = parse_qs(parts.query)
        segments = (
            [unquote(s) for s in parts.path.strip("/").split("/")] if parts.path != "/" else []
        )
        store = self._store
        match method, segments:
            case "GET", []:
                return {}
            case "GET", ["subjects"]:
                prefix = query.get("subjectPrefix", [""])[0]
                with store.lock:
                    return sorted(s for s in store.subjects if s.startswith(prefix))
            case "POST", ["subjects", subject, "versions"]:
                schema_id, _ = store.register(subject, _schema_from_body(body))
                return {"id": schema_id}
            case "POST", ["subjects", subject]:
                schema = _schema_from_body(body)
                schema_id, version = store.lookup(subject, schema)
                return {"subject": subject, "id": schema_id, "version": version} | schema.as_json()
            case "DELETE", ["subjects", subject]:
                return store.delete_subject(subject)
            case "GET", ["subjects", subject, "versions"]:
                return store.versions(subject)
            case "GET", ["subjects", subject, "versions", version]:
                number, schema_id, schema = store.version(subject, version)
                return {"subject": subject, "version": number, "id": schema_id} | schema.as_json()
            case "GET", ["subjects", subject, "versions", version, "referencedby"]:
                return store.referenced_by(subject, version)
            case "GET", ["schemas", "types"]:
                return list(_SCHEMA_TYPES)
            case "GET", ["schemas", "ids", schema_id]:
                return store.by_id(_parse_schema_id(schema_id)).as_json()
            case "GET", ["schemas", "ids", schema_id, "versions"]:
                pairs = store.versions_of_id(_parse_schema_id(schema_id))
                return [{"subject": s, "version": v} for s, v in pairs]
            case "GET", ["schemas", "ids", schema_id, "subjects"]:
                pairs = store.versions_of_id(_parse_schema_id(schema_id))
                return sorted({s for s, _ in pairs})
            case "GET", ["config"]:
                return {"compatibilityLevel": "BACKWARD"}
            case "GET", ["config", subject]:
                if query.get("defaultToGlobal", ["false"])[0] == "true":
                    return {"compatibilityLevel": "BACKWARD"}
                raise RegistryError(
                    404,
                    40408,
                    f"Subject '{subject}' does not have subject-level compatibility configured",
                )
            case "GET", ["mode"]:
                return {"mode": "READWRITE"}
            case "GET", ["associations", "resources", _namespace, _resource]:
                return []  # none kept: clients fall back to their topic-name strategy
        raise _NOT_FOUND
