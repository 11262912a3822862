"""The proxy's commands of the `kvproxy` command line: serve, check, demo, dump, quarantine,
topics (`kvproxy.cli` puts them and the other layers' together)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from kvproxy.commands import demo, dump
from kvproxy.commands import quarantine as quarantine_cli
from kvproxy.commands import topics as topics_cli
from kvproxy.policies import plugins
from kvproxy.policies.config import TopicRouting
from kvproxy.policies.topic_settings import FIELD_NAMES
from kvproxy.protocol import fast_accept
from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.records import skim
from kvproxy.proxy.config.listen_config import ListenConfig
from kvproxy.proxy.config.proxy_config import LimitsConfig, ProxyConfig, load_config_and_rules
from kvproxy.proxy.ops.fds import (
    DEFAULT_MAX_CONNECTIONS_PER_LISTENER,
    connections_allowed,
    open_file_limit_target,
)
from kvproxy.proxy.serve.signals import queue_sighup
from kvproxy.settings.audit_file import read_audit_file
from kvproxy.settings.loading import ConfigError, read_document


def _add_serve(subparsers: Any) -> None:
    parser = subparsers.add_parser("serve", help="run the proxy in the foreground")
    parser.add_argument("-c", "--config", required=True, help="YAML configuration file")
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="text (default) or json: one JSON object per line with every structured field",
    )
    parser.add_argument(
        "--reload-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="how often the config file is checked for changes (default 1; 0: only on SIGHUP)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="run N proxy processes sharing the listeners (SO_REUSEPORT; default 1)",
    )
    # Set by the supervisor of --workers N for each worker it starts; not for people.
    parser.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-state", type=Path, default=None, help=argparse.SUPPRESS)
    parser.set_defaults(func=_serve)


def _add_check(subparsers: Any) -> None:
    parser = subparsers.add_parser("check", help="validate a configuration file without serving")
    parser.add_argument("-c", "--config", required=True, help="YAML configuration file")
    parser.add_argument(
        "--connect",
        action="store_true",
        help="also ask the cluster for its brokers and show the proxy port of each (exit 2 when "
        "a node would have none, as serve would refuse to start), and ask the schema registry "
        "(exit 1 when a URL does not answer or refuses the credentials)",
    )
    parser.add_argument(
        "--for",
        dest="reader",
        choices=("serve", "audit"),
        default="serve",
        help="check the file as `serve` reads it (the default) or as `audit` reads it: only the "
        "policy sections, errors.profile and schema_registry (a backtest-only file needs no "
        "upstream)",
    )
    parser.set_defaults(func=_check)


def _serve(args: argparse.Namespace) -> int:
    from kvproxy.proxy.errors import ProxyError  # noqa: PLC0415
    from kvproxy.proxy.ops.logs import configure_logging  # noqa: PLC0415
    from kvproxy.proxy.serve.app import run  # noqa: PLC0415  (keeps `kvproxy dump` free of asyncio start-up)
    from kvproxy.proxy.serve.reload import file_signature  # noqa: PLC0415
    from kvproxy.proxy.serve.server import WorkerRole  # noqa: PLC0415
    from kvproxy.proxy.serve.workers import WorkersError, WorkerSettings, run_workers  # noqa: PLC0415

    queue_sighup()  # before anything else: a SIGHUP while starting is not fatal
    configure_logging(args.log_format, worker=args.worker_index)
    path = Path(args.config)
    worker = None
    if args.worker_index is not None and args.worker_state is not None:
        worker = WorkerRole(args.worker_index, args.worker_state)
    try:
        loaded = file_signature(path)  # a change from here on is reloaded once serving
        config, routing = load_config_and_rules(path)  # every problem of the file, at once
        if args.workers != 1 and worker is None:
            routing.close()  # each worker serves with the rules it builds itself
            settings = WorkerSettings(path, args.workers, args.log_format, args.reload_interval)
            run_workers(config, settings)
            return 0
        _raise_open_file_limit(config, log_unchanged=args.worker_index in (None, 0))
        if args.worker_index in (None, 0):  # said once, as the open file limit is
            scan = "compiled" if skim.COMPILED else "pure Python (no C compiler at install)"
            logging.getLogger("kvproxy").info("record scan: %s", scan)
            accept = "compiled" if fast_accept.COMPILED else "off (pure Python: every request"
            if not fast_accept.COMPILED:
                accept += " decided by the policies' Python path)"
            logging.getLogger("kvproxy").info("fast accept: %s", accept)
        run(
            config,
            path.resolve().parent,
            config_path=path,
            config_loaded=loaded,
            reload_poll_s=args.reload_interval,
            worker=worker,
            routing=routing,  # built once: custom classes imported, schemas compiled
        )
    except WorkersError as exc:
        return _fail(args, str(exc), exc.exit_code)
    except ConfigError as exc:
        return _fail(args, str(exc), 2)
    except ProxyError as exc:  # e.g. a broker node id outside the configured port range
        return _fail(args, f"{args.config}: {exc}", 2)
    except OSError as exc:  # e.g. a listener port already in use
        return _fail(args, f"cannot serve: {exc}", 1)
    return 0


def _raise_open_file_limit(config: ProxyConfig, *, log_unchanged: bool) -> None:
    """The soft limit on open files up to the hard one, said once: each client connection holds
    two descriptors, and a soft limit of 1024 (many systems' default) runs out at about 500."""
    from kvproxy.proxy.ops.fds import raise_open_file_limit  # noqa: PLC0415  (tests replace it)

    log = logging.getLogger("kvproxy")
    before, after, problem = raise_open_file_limit()
    if problem is not None:
        log.warning("open file limit %d could not be raised to the hard limit: %s", before, problem)
    elif after != before:
        log.info("open file limit raised from %d to %d (the hard limit)", before, after)
    elif log_unchanged:
        log.info("open file limit %d (the hard limit)", after)
    if not log_unchanged:
        return
    per_listener, allowed = config.limits.max_connections_per_listener, connections_allowed(after)
    if per_listener > allowed:  # set too high, or unset and the limit could not be raised
        log.warning(
            "open file limit %d has room for %d client connections (two descriptors each), "
            "fewer than limits.max_connections_per_listener (%d): clients can run the proxy out "
            "of file descriptors before that limit refuses them; raise the hard limit "
            "(ulimit -Hn, LimitNOFILE=) or lower the setting",
            after,
            allowed,
            per_listener,
        )
    elif "max_connections_per_listener" not in config.limits.model_fields_set:
        log.info(
            "limits.max_connections_per_listener: %d (%s)",
            per_listener,
            _unset_connection_limit(per_listener),
        )


def _unset_connection_limit(per_listener: int) -> str:
    """Where an unset `limits.max_connections_per_listener` comes from, for serve and check."""
    if per_listener == DEFAULT_MAX_CONNECTIONS_PER_LISTENER:
        return "unset: the default"
    return (
        f"unset: what the open file limit {open_file_limit_target()} has room for, below the "
        f"default {DEFAULT_MAX_CONNECTIONS_PER_LISTENER}"
    )


def _fail(args: argparse.Namespace, message: str, code: int) -> int:
    """Report why `serve` stops: a plain line, or a JSON log record with --log-format json."""
    if args.log_format == "json":
        logging.getLogger("kvproxy").error("%s", message, extra={"exit_code": code})
    else:
        print(f"kvproxy: {message}", file=sys.stderr)
    return code


def describe(config: ProxyConfig) -> list[str]:
    listen, upstream = config.listen, config.upstream
    source = (
        "embedded development broker"
        if upstream.embedded
        else ", ".join(upstream.bootstrap_servers)
    )
    limits = config.limits
    return [
        *_describe_listeners(listen),
        f"upstream: {source}" + (" (TLS)" if upstream.tls else ""),
        f"limits: frames up to {limits.max_frame_bytes} bytes, "
        f"{limits.max_in_flight_requests} requests in flight per connection, "
        f"{limits.max_records_per_request} records per produce request",
        f"connections: {_connections_per_listener(limits)}, "
        f"{limits.max_connections_per_client} per client address; closed after "
        f"{limits.idle_timeout_ms} ms idle or {limits.request_timeout_ms} ms stalled inside a "
        "request",
        f"shutdown: drain in-flight requests for up to {config.shutdown.drain_timeout_ms} ms",
        *_describe_registry(config),
    ]


def _connections_per_listener(limits: LimitsConfig) -> str:
    per_listener = limits.max_connections_per_listener
    if "max_connections_per_listener" in limits.model_fields_set:
        return f"{per_listener} per listener"
    return f"{per_listener} per listener ({_unset_connection_limit(per_listener)})"


def _describe_listeners(listen: ListenConfig) -> list[str]:
    """The port-per-broker listeners and the SNI listener, as `serve` would open them."""
    lines = []
    if listen.port_per_broker:
        lines += [
            f"bootstrap listener: {listen.host}:{listen.port}"
            + (" (TLS)" if listen.tls else "")
            + f", advertised as {listen.public_host}",
            f"broker listeners: {listen.port_rule}",
        ]
    else:
        lines.append("port-per-broker listeners: none (listen.port_per_broker: false)")
    sni = listen.sni
    if sni is not None:
        advertised = sni.advertised_port or sni.port
        lines.append(
            f"SNI listener: {sni.host or listen.host}:{sni.port} (TLS), bootstrap {sni.bootstrap}"
            f":{advertised}, brokers {sni.brokers}:{advertised}, without a server name: "
            + ("the bootstrap" if sni.without_sni == "bootstrap" else "refused")
        )
    return lines


def _describe_registry(config: ProxyConfig) -> list[str]:
    registry = config.schema_registry
    if registry is None:
        return []
    auth = (
        "basic auth"
        if registry.basic_auth is not None
        else "bearer token"
        if registry.bearer_token is not None
        else "no auth"
    )
    return [
        f"schema registry: {', '.join(registry.url)} ({auth}), {registry.timeout_ms} ms per "
        f"request, answers kept {registry.cache_ttl_ms} ms (failures "
        f"{registry.negative_cache_ttl_ms} ms) for up to {registry.cache_max_schemas} ids, "
        f"on_error {registry.on_error}"
    ]


def _check(args: argparse.Namespace) -> int:
    if getattr(args, "reader", "serve") == "audit":
        return _check_for_audit(args)
    try:
        config, routing = load_config_and_rules(args.config)
    except ConfigError as exc:  # kvproxy's main prints it and exits 2
        if exc.problems and not _keys(args) & _SERVE_ONLY_SECTIONS:
            exc.args = (
                f"{exc}\n  (a file only for `kvproxy audit`? `kvproxy check --for audit -c "
                f"{args.config}` checks what the audit reads)",
            )
        raise
    print(f"{args.config}: OK")
    for line in describe(config):
        print(f"  {line}")
    _print_rules(routing)
    routing.close()
    if not getattr(args, "connect", False):
        return _check_certificate(config, node_ids=None)
    cluster, node_ids = _check_cluster(config)
    return max(cluster, _check_registry(config), _check_certificate(config, node_ids))


_SERVE_ONLY_SECTIONS = frozenset(ProxyConfig.model_fields) - {
    "defaults",
    "topics",
    "errors",
    "schema_registry",
}
"""Sections only `serve` reads: a file with none of them may be written for the audit."""


def _keys(args: argparse.Namespace) -> set[str]:
    """The top-level keys of the file (it was read once already: it parses)."""
    document, _lines = read_document(Path(args.config))
    return set(document or {})


def _check_for_audit(args: argparse.Namespace) -> int:
    """The file as `kvproxy audit` reads it (a ConfigError: main exits 2)."""
    read = read_audit_file(Path(args.config), plugins.entry_point_targets())
    print(f"{args.config}: OK for kvproxy audit (its other sections are the proxy's, unchecked)")
    print(f"  errors.profile: {read.profile}")
    if read.schema_registry is not None:
        print(f"  schema registry: {', '.join(read.schema_registry.url)}")
    _print_rules(read.routing)
    read.routing.close()
    return 0


def _print_rules(routing: TopicRouting) -> None:
    print("  topics (first match wins):")
    for rule in routing.all_rules():
        pattern = rule.match if rule.match is not None else "(every other topic)"
        compacted = {None: "from the cluster", True: "yes", False: "no"}[rule.compacted]
        names = ", ".join(rule.policy_names) or "none"
        settings = ", ".join(
            f"{name} {value}"
            for field_name, name in FIELD_NAMES.items()
            if field_name != "compacted" and (value := getattr(rule.config, field_name)) is not None
        )
        print(
            f"    {pattern}: mode {rule.mode.value}, compacted {compacted}"
            + (f", settings: {settings}" if settings else "")
            + f", policies: {names}"
            + (f"; {rule.defaults_summary}" if rule.defaults_summary else "")
        )


def _check_registry(config: ProxyConfig) -> int:
    """Each registry URL asked once (`GET /subjects`): 0 when every one answers, 1 otherwise."""
    import asyncio  # noqa: PLC0415

    from kvproxy.registry.client import RegistryClient  # noqa: PLC0415

    if config.schema_registry is None:
        return 0

    async def ask() -> list[tuple[bool, str]]:
        client = RegistryClient(config.schema_registry)  # type: ignore[arg-type]
        try:
            return await client.check()
        finally:
            await client.aclose()

    answers = asyncio.run(ask())
    print("  schema registry:")
    for _ok, line in answers:
        print(f"    {line}")
    if all(ok for ok, _line in answers):
        return 0
    print("kvproxy: the schema registry did not answer on every URL", file=sys.stderr)
    return 1


def _check_cluster(config: ProxyConfig) -> tuple[int, list[int] | None]:
    """What `serve` would do with the cluster's brokers: each node's proxy port, or why a node
    has none. 0: every node has a port; 1: the cluster did not answer; 2: a node has no port.
    With the node ids the cluster named (None: it did not answer)."""
    import asyncio  # noqa: PLC0415

    from kvproxy.client.async_requests import fetch_broker_addresses  # noqa: PLC0415
    from kvproxy.proxy.cluster.upstream_failures import describe_failure  # noqa: PLC0415
    from kvproxy.proxy.listen.tls_context import upstream_side_ssl  # noqa: PLC0415
    from kvproxy.proxy.serve.embedded import run_embedded_broker  # noqa: PLC0415

    timeout = config.upstream.connect_timeout_ms / 1000
    context = upstream_side_ssl(config)

    def ask(servers: tuple[tuple[str, int], ...]) -> dict[int, tuple[str, int]] | None:
        for host, port in servers:
            try:
                return asyncio.run(fetch_broker_addresses(host, port, context, timeout))
            except (OSError, TimeoutError, ProtocolError) as exc:
                print(
                    f"  cluster: metadata from {host}:{port} failed: "
                    f"{describe_failure(exc, timeout)}"
                )
        return None

    if config.upstream.embedded:
        with run_embedded_broker() as broker:
            nodes = ask(((broker.host, broker.port),))
    else:
        nodes = ask(config.upstream.addresses())
    if nodes is None:
        print(
            "kvproxy: the cluster did not answer: serve would listen but not be ready",
            file=sys.stderr,
        )
        return 1, None
    listen = config.listen
    ports, problems = listen.plan_ports(sorted(nodes)) if listen.port_per_broker else ({}, [])
    print(f"  cluster: {len(nodes)} broker(s)")
    sni = listen.sni
    for node_id, (host, port) in sorted(nodes.items()):
        proxied = [f"{listen.public_host}:{ports[node_id]}"] if node_id in ports else []
        if sni is not None:
            proxied.append(f"{sni.names.name_of(node_id)}:{sni.advertised_port or sni.port}")
        if proxied:
            print(f"    node {node_id} at {host}:{port} -> {', '.join(proxied)}")
    for problem in problems:
        print(f"kvproxy: {problem}", file=sys.stderr)
    return 2 if problems else 0, sorted(nodes)


def _check_certificate(config: ProxyConfig, node_ids: list[int] | None) -> int:
    """The SNI listener's certificate against its server names (every node's when the cluster
    named them): 0 when it covers them all and is valid now, 1 when it lacks a name or is out
    of its validity period, 2 when it cannot be read (serve would not start)."""
    from datetime import UTC, datetime  # noqa: PLC0415

    from kvproxy.commands.certificate_coverage import (  # noqa: PLC0415  (cryptography: only here)
        certificate_coverage,
        read_certificate,
    )

    sni, tls = config.listen.sni, config.listen.sni_tls
    if sni is None or tls is None:
        return 0
    try:
        certificate = read_certificate(tls.cert_file)
    except (OSError, ValueError) as exc:
        print(
            f"kvproxy: cannot read the SNI listener's certificate {tls.cert_file}: {exc}",
            file=sys.stderr,
        )
        return 2
    coverage = certificate_coverage(certificate, sni.names, node_ids, datetime.now(UTC))
    print(f"  SNI listener certificate {tls.cert_file}:")
    for line in coverage.lines:
        print(f"    {line}")
    for problem in coverage.problems:
        print(f"kvproxy: the SNI listener's certificate {tls.cert_file} {problem}", file=sys.stderr)
    return 1 if coverage.problems else 0


def add_commands(subparsers: Any) -> None:
    """The proxy's subcommands, in the order `kvproxy --help` lists them."""
    _add_serve(subparsers)
    _add_check(subparsers)
    demo.add_parser(subparsers)
    dump.add_parser(subparsers)
    quarantine_cli.add_parser(subparsers)
    topics_cli.add_parser(subparsers)


if (
    __name__ == "__main__"
):  # the command is `kvproxy` (kvproxy/cli.py), which puts the parts together
    sys.exit(
        "kvproxy.commands.cli only contributes subcommands:"
        " run `kvproxy ...` or `python -m kvproxy.cli ...`"
    )
