"""The `schema_registry` section: where the `schema` policy's registry is and how to ask it.

Read by the proxy (which asks the registry as requests need ids) and by the audit (whose
driver fetches the ids the data holds, once, before the executors check it).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kvproxy.policies.api import Need
from kvproxy.policies.config import TopicRouting
from kvproxy.policies.errors import ConfigProblem
from kvproxy.settings.loading import Section, validate
from kvproxy.settings.secrets import Secret

__all__ = [
    "REGISTRY_MISSING",
    "RegistryBasicAuth",
    "RegistryTls",
    "SchemaRegistryConfig",
    "read_registry_section",
    "registry_missing",
]


class RegistryBasicAuth(Section):
    """HTTP basic authentication (Confluent's `basic.auth.user.info`)."""

    username: str = Field(min_length=1)
    password: Secret
    """`${NAME}` reads it from the environment."""


class RegistryTls(Section):
    """HTTPS to the registry: the CA to trust and, for mutual TLS, a client certificate."""

    ca_file: Path | None = None
    """Verify the registry against this CA bundle; None: the system's trusted CAs."""
    cert_file: Path | None = None
    key_file: Path | None = None
    key_password: Secret | None = None

    @model_validator(mode="after")
    def _pair(self) -> RegistryTls:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (a client certificate)")
        return self


class SchemaRegistryConfig(Section):
    """A Confluent-compatible schema registry (its REST API)."""

    url: tuple[str, ...] = Field(min_length=1)
    """One or more base URLs, tried in turn when one cannot be reached."""
    basic_auth: RegistryBasicAuth | None = None
    bearer_token: Secret | None = None
    tls: RegistryTls | None = None
    timeout_ms: int = Field(default=2_000, ge=1, le=600_000)
    """For one HTTP request, connecting included."""
    cache_ttl_ms: int = Field(default=300_000, ge=1_000)
    """How long what the registry said about an id (its schema, its subjects) is trusted."""
    negative_cache_ttl_ms: int = Field(default=5_000, ge=0)
    """How long "no such id", "not registered under this subject" and a failed lookup are
    trusted before the registry is asked again; after a lookup no URL answered at all, how long
    fresh ids fail fast without asking (`kvproxy/registry/health.py`)."""
    cache_max_schemas: int = Field(default=10_000, ge=1, le=1_000_000)
    """Ids held at most (the answers stored longest ago go first)."""
    max_lookups_per_request: int = Field(default=64, ge=1, le=10_000)
    """Distinct unknown ids one Produce request may make the proxy look up; records with more
    are answered as if the registry were unavailable (`on_error`)."""
    request_wait_ms: int = Field(default=10_000, ge=1, le=600_000)
    """How long one Produce request waits for its lookups, a free lookup slot included;
    partitions whose ids are still unanswered then get the registry-unavailable answer
    (`on_error`), and a lookup nobody waits for any more is dropped. Keep it above the time
    one lookup takes (`timeout_ms` per URL and reference)."""
    lookups_per_connection: int = Field(default=4, ge=1, le=16)
    """Lookups one client connection runs at once, of the 16 the proxy runs together: a client
    sending ids the registry is slow to answer cannot take every slot."""
    max_schema_bytes: int = Field(default=1_048_576, ge=1_024)
    """The largest registry answer read (one schema with its metadata)."""
    on_error: Literal["reject", "accept"] = "reject"
    """When the registry cannot be reached or answers nonsense: `reject` answers the partition
    REQUEST_TIMED_OUT (retriable: producers retry, nothing is lost), `accept` lets the records
    through unchecked. Counted and logged either way."""

    @field_validator("url", mode="before")
    @classmethod
    def _one_or_more(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("url")
    @classmethod
    def _http(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return tuple(url.rstrip("/") for url in value)

    @model_validator(mode="after")
    def _one_auth(self) -> SchemaRegistryConfig:
        if self.basic_auth is not None and self.bearer_token is not None:
            raise ValueError("basic_auth and bearer_token: set one, not both")
        return self


class _RegistrySection(BaseModel):
    """The `schema_registry` section alone, out of a whole file (the audit reads no other)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    schema_registry: SchemaRegistryConfig | None = None


def read_registry_section(
    document: Mapping[str, Any],
) -> tuple[SchemaRegistryConfig | None, list[ConfigProblem]]:
    """The `schema_registry` section of a file, checked as the proxy checks it, or its
    problems (by key path, for the file's report)."""
    if "schema_registry" not in document:
        return None, []
    section, problems = validate(_RegistrySection, {"schema_registry": document["schema_registry"]})
    return (None if section is None else section.schema_registry), problems


REGISTRY_MISSING = "the schema policy needs a schema_registry section (its url at least)"


def registry_missing(routing: TopicRouting) -> ConfigProblem | None:
    """The problem of rules that check schemas with no registry to ask: at the first such
    topic rule (or `defaults`), for the file's report."""
    for position, rule in enumerate(routing.rules):
        if Need.SCHEMAS in rule.chain.needs:
            return ConfigProblem(("topics", position), REGISTRY_MISSING)
    if Need.SCHEMAS in routing.default.chain.needs:
        return ConfigProblem(("defaults",), REGISTRY_MISSING)
    return None
