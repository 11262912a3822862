"""HTTP to the registry: its URLs in turn, authentication, TLS, a time limit per request and a
size limit per answer. One `httpx.AsyncClient` (connection reuse) per `RegistryClient`."""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

# httpx imports its transport, HTTP/1.1 parser, async backend and CA bundle on the first
# request: ~0.3 s of imports on the event loop, inside the first lookup's time limit. They are
# imported here, when the proxy starts.
import anyio._backends._asyncio  # noqa: F401
import certifi  # noqa: F401
import h11  # noqa: F401
import httpcore  # noqa: F401
import httpx

from kvproxy.registry.answers import RegistryError, read_error
from kvproxy.settings.schema_registry import SchemaRegistryConfig

__all__ = ["Answer", "RegistryClient", "Unreachable", "transport_failure"]

ACCEPT = "application/vnd.schemaregistry.v1+json, application/json"


@dataclass(frozen=True, slots=True)
class Answer:
    """A 2xx answer's body."""

    body: bytes


class Unreachable(Exception):
    """No URL gave an answer that counts: each was down, too slow, failed (5xx) or garbled.
    `silent` when none answered at all (each timed out or took no connection): the registry,
    not one id's schema, is what failed."""

    def __init__(self, message: str, *, silent: bool = False) -> None:
        super().__init__(message)
        self.silent = silent


RequestObserver = Callable[[str, float], None]
"""Called with the outcome ("ok", "not_found", "error", "timeout", "unreachable",
"too_large") and the seconds one HTTP request took."""


class RegistryClient:
    """GETs against the registry. A 4xx answer is the registry's word (`RegistryError`); a
    connection failure, time-out, 5xx or an oversized answer moves on to the next URL, and when
    none is left raises `Unreachable` naming what each did."""

    def __init__(
        self, config: SchemaRegistryConfig, observe: RequestObserver | None = None
    ) -> None:
        self.config = config
        self._observe = observe or (lambda outcome, seconds: None)
        self._client: httpx.AsyncClient | None = None
        self._http()  # now, when the proxy starts: loading a CA bundle takes tens of ms

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            config = self.config
            headers = {"Accept": ACCEPT}
            auth: httpx.Auth | None = None
            if config.basic_auth is not None:
                auth = httpx.BasicAuth(
                    config.basic_auth.username, config.basic_auth.password.get_secret_value()
                )
            if config.bearer_token is not None:
                headers["Authorization"] = f"Bearer {config.bearer_token.get_secret_value()}"
            self._client = httpx.AsyncClient(
                headers=headers,
                auth=auth,
                verify=tls_context(config),
                timeout=httpx.Timeout(config.timeout_ms / 1000),
                follow_redirects=False,
                trust_env=False,
            )
        return self._client

    async def get(self, path: str) -> Answer | RegistryError:
        failures = []
        silent = True
        for base in self.config.url:
            try:
                return await self._get(base + path)
            except _Failed as failed:
                failures.append(f"{base}: {failed}")
                silent = silent and failed.silent
        raise Unreachable("; ".join(failures), silent=silent)

    async def _get(self, url: str) -> Answer | RegistryError:
        started = time.perf_counter()
        outcome = "error"
        limit = self.config.max_schema_bytes
        # made before the clock starts: building the client (its TLS context) blocks for tens
        # of milliseconds, which would count against the first request's timeout
        http = self._http()
        try:
            async with asyncio.timeout(self.config.timeout_ms / 1000):
                async with http.stream("GET", url) as response:
                    body = bytearray()
                    async for chunk in response.aiter_bytes():
                        body += chunk
                        if len(body) > limit:
                            outcome = "too_large"
                            raise _Failed(f"the answer is over max_schema_bytes ({limit})", False)
            status = response.status_code
            if status >= 500:
                raise _Failed(str(read_error(status, bytes(body))), False)
            if 200 <= status < 300:
                outcome = "ok"
                return Answer(bytes(body))
            outcome = "not_found" if status == 404 else "error"
            return read_error(status, bytes(body))
        except TimeoutError:
            outcome = "timeout"
            raise _Failed(f"no answer within {self.config.timeout_ms} ms", True) from None
        except httpx.HTTPError as exc:
            outcome = "unreachable"
            raise _Failed(transport_failure(exc), isinstance(exc, httpx.TransportError)) from None
        finally:
            self._observe(outcome, time.perf_counter() - started)

    async def check(self) -> list[tuple[bool, str]]:
        """Per URL: whether it answers `GET /subjects` (reachable, the credentials accepted),
        and a line saying so and how long it took; for `kvproxy check`."""
        lines = []
        for base in self.config.url:
            started = time.perf_counter()
            try:
                answer = await self._get(base + "/subjects")
            except _Failed as failed:
                lines.append((False, f"{base}: unreachable: {failed}"))
                continue
            took = (time.perf_counter() - started) * 1000
            if isinstance(answer, RegistryError):
                lines.append((False, f"{base}: refused: {answer}"))
            else:
                lines.append((True, f"{base}: ok ({took:.0f} ms)"))
        return lines

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


class _Failed(Exception):
    """This URL gave nothing that counts; the next one is tried. `silent`: it gave no answer
    at all (a time-out, no connection, the connection lost)."""

    def __init__(self, message: str, silent: bool) -> None:
        super().__init__(message)
        self.silent = silent


def transport_failure(exc: httpx.HTTPError) -> str:
    """What went wrong on the connection, with the system's word for it when an OS error is
    behind it: httpx says only "All connection attempts failed" for a refused connection."""
    text = f"{type(exc).__name__}: {str(exc)[:200] or 'no detail'}"
    cause = exc.__cause__ or exc.__context__
    for _ in range(8):
        if cause is None:
            break
        if isinstance(cause, OSError) and cause.errno is not None:
            return f"{text} ({os.strerror(cause.errno)})"
        cause = cause.__cause__ or cause.__context__
    return text


def tls_context(config: SchemaRegistryConfig) -> ssl.SSLContext | bool:
    """The context that verifies the registry (the system's CAs when no `tls.ca_file`); False
    when every URL is plain http (no certificates to load, nothing to verify)."""
    tls = config.tls
    if not any(url.startswith("https://") for url in config.url):
        return False
    if tls is None:
        return True
    context = ssl.create_default_context(
        cafile=str(tls.ca_file) if tls.ca_file is not None else None
    )
    if tls.cert_file is not None and tls.key_file is not None:
        context.load_cert_chain(
            str(tls.cert_file),
            str(tls.key_file),
            tls.key_password.get_secret_value() if tls.key_password is not None else None,
        )
    return context
