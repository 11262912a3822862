"""`kvproxy serve --workers N` as a user runs it: one supervisor process and N workers sharing the
listeners, in front of Tansu, with confluent-kafka clients, signals and the metrics port.

Starting the workers costs seconds of imports on a busy machine, so the tests that only need a
running proxy share one supervisor, in file order: connections spread, quarantine, SIGHUP, a
killed worker, and SIGTERM last (it stops the supervisor). The supervisor killed with SIGKILL, the
SIGHUP sent while the workers start and the refused command lines have processes of their own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kvproxy.journal import JournalReader
from tests.harness import Broker
from tests.harness.clients import consume_through
from tests.harness.processes import REPO
from tests.harness.proxy import free_port_range
from tests.harness.tansu import free_port

# One xdist worker runs the whole file: the shared supervisor is started once, tests keep order.
pytestmark = pytest.mark.xdist_group("proxy_workers")

HOST = "127.0.0.1"
WORKERS = 2
CONNECTIONS = 16
START_TIMEOUT_S = 90.0
"""Two workers importing on two busy cores can take many seconds; the supervisor allows 60."""
DRAIN_TIMEOUT_MS = 2000
TOO_BIG_TOPICS = "too-big-*"
"""Topics whose records may not exceed 10 bytes (key + value + headers)."""
TOO_BIG_RULE = {"default_policies": "drop", "policies": [{"max_record_bytes": {"limit": 10}}]}
MSG_SIZE_TOO_LARGE = 10
"""Kafka's MESSAGE_TOO_LARGE, as confluent-kafka reports it (KafkaError.MSG_SIZE_TOO_LARGE)."""

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
T = TypeVar("T")


def wait_until(
    condition: Callable[[], T | None],
    what: str,
    timeout: float,
    explain: Callable[[], str] = lambda: "",
) -> T:
    """`condition()`'s first true result, checked every 50 ms for at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{explain()}")
        time.sleep(0.05)


def http_get(url: str) -> tuple[int, str]:
    """(status, body) of GET url; (0, why) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:
        return 0, str(error)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def by_worker(samples: Samples, name: str, **labels: str) -> dict[str, float]:
    """The samples of `name` that carry `labels`, summed per `worker` label."""
    totals: dict[str, float] = {}
    for (sample, keys), number in samples.items():
        found = dict(keys)
        if sample == name and all(found.get(k) == v for k, v in labels.items()):
            worker = found.get("worker", "")
            totals[worker] = totals.get(worker, 0.0) + number
    return totals


def gone(process: psutil.Process) -> bool:
    """The process has exited (a zombie nobody reaped yet counts as exited)."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class Supervisor:
    """`kvproxy serve -c FILE --workers 2 --reload-interval 0`, its config and its log file."""

    def __init__(
        self, proc: subprocess.Popen[bytes], config_path: Path, config: dict[str, Any], log: Path
    ) -> None:
        self.proc = proc
        self.config_path = config_path
        self.config = config
        self.log = log
        self.seen: dict[int, psutil.Process] = {}
        """Every worker process ever seen, by pid: the clean-up stops any that is left."""

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.config['listen']['port']}"

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.config['metrics']['port']}"

    @property
    def journal_dir(self) -> Path:
        return self.config_path.parent / self.config["quarantine"]["dir"]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def explain(self) -> str:
        return f"--- kvproxy log ---\n{self.log_text()}"

    def assert_running(self) -> None:
        code = self.proc.poll()
        assert code is None, f"the supervisor exited with {code}\n{self.explain()}"

    def workers(self) -> dict[int, psutil.Process]:
        """The supervisor's running worker processes by worker index."""
        found: dict[int, psutil.Process] = {}
        for child in psutil.Process(self.proc.pid).children():
            try:
                if child.status() == psutil.STATUS_ZOMBIE:
                    continue
                command = child.cmdline()
            except psutil.NoSuchProcess:
                continue
            self.seen[child.pid] = child
            if "--worker-index" in command:
                found[int(command[command.index("--worker-index") + 1])] = child
        return found

    def scrape(self) -> Samples:
        """Every sample on the supervisor's /metrics, keyed by (name, sorted labels)."""
        status, text = http_get(f"{self.metrics_url}/metrics")
        assert status == 200, f"/metrics answered {status}: {text}"
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def readyz(self) -> tuple[int, str]:
        return http_get(f"{self.metrics_url}/readyz")

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        def ready() -> bool:
            self.assert_running()
            return self.readyz()[0] == 200

        wait_until(ready, "/readyz to answer 200", timeout, self.explain)

    def write_config(self, **sections: Any) -> None:
        """Replace the config file the way an editor does (write aside, rename)."""
        self.config = {**self.config, **sections}
        staged = self.config_path.with_suffix(".tmp")
        staged.write_text(yaml.safe_dump(self.config))
        staged.replace(self.config_path)

    def orphans(self) -> list[psutil.Process]:
        """Workers of this supervisor that outlived it: they stay in its session (its pid)."""
        found = []
        for process in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error, OSError):
                command = process.info["cmdline"] or []
                if "--worker-state" in command and os.getsid(process.pid) == self.proc.pid:
                    found.append(process)
        return found

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 20 s), then SIGKILL for any worker still alive."""
        if self.proc.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                self.workers()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGSTOP)  # no new worker while it is taken apart
                with contextlib.suppress(psutil.NoSuchProcess):
                    self.workers()
                self.proc.kill()
                self.proc.wait(10)
        self.seen.update((p.pid, p) for p in self.orphans())
        for worker in self.seen.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                worker.kill()
        psutil.wait_procs(list(self.seen.values()), timeout=10)


@contextlib.contextmanager
def serve_workers(directory: Path, tansu: Broker, *, ready: bool = True) -> Iterator[Supervisor]:
    """A supervisor of 2 workers in front of `tansu`, on free ports; ready (/readyz 200) unless
    `ready` is False (then as soon as it runs)."""
    # every port below the ephemeral range, where no outgoing connection of another test can
    # take it between this choice and the workers' bind: brokers, then bootstrap and metrics
    base = free_port_range(22)
    config: dict[str, Any] = {
        "listen": {
            "host": HOST,
            "port": base + 20,
            "broker_port_base": base,
            "lowest_node_id": 100,  # Tansu is node 111
            "max_brokers": 20,
        },
        "upstream": {"bootstrap_servers": [tansu.bootstrap]},
        "shutdown": {"drain_timeout_ms": DRAIN_TIMEOUT_MS},
        "metrics": {"host": HOST, "port": base + 21},
        "quarantine": {"dir": "journal", "flush_interval_ms": 50},
        "topics": [{"match": TOO_BIG_TOPICS, **TOO_BIG_RULE}],
    }
    config_path = directory / "kvproxy.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log = directory / "kvproxy.log"
    command = [sys.executable, "-m", "kvproxy.cli", "serve", "-c", str(config_path)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*command, "--workers", str(WORKERS), "--reload-interval", "0"],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,  # a ^C in the terminal does not reach it twice
        )
    supervisor = Supervisor(proc, config_path, config, log)
    try:
        if ready:
            supervisor.wait_ready()
        yield supervisor
    finally:
        supervisor.stop()


@pytest.fixture(scope="module")
def workers(tansu: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    """The supervisor the tests of this file share (the SIGTERM test, last, stops it)."""
    with serve_workers(tmp_path_factory.mktemp("workers"), tansu) as supervisor:
        yield supervisor


def produce_one_each(
    bootstrap: str, topic: str, payloads: Sequence[bytes], timeout: float = 30
) -> list[int | None]:
    """Each payload sent by a Producer of its own (its own connections) to partition 0: the
    delivery error code of each, None when it was delivered."""
    from confluent_kafka import Producer

    results: dict[bytes, int | None] = {}

    def delivered(error: Any, message: Any) -> None:
        results[message.value()] = None if error is None else error.code()

    producers = []
    for payload in payloads:
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 0,
                "message.timeout.ms": int(timeout * 1000),
            }
        )
        producer.produce(topic, payload, partition=0, on_delivery=delivered)
        producer.poll(0)
        producers.append(producer)
    deadline = time.monotonic() + timeout + 5
    for producer in producers:
        left = producer.flush(max(0.1, deadline - time.monotonic()))
        assert left == 0, f"{left} record(s) neither delivered nor failed in {timeout} s"
    return [results[payload] for payload in payloads]


def numbered(what: str, count: int = CONNECTIONS) -> list[bytes]:
    return [f"{what}-{n:02d}".encode() for n in range(count)]


# ---- the shared supervisor ----


def test_clients_spread_over_the_workers_and_one_metrics_port_shows_each(
    workers: Supervisor, make_topic: Callable[..., str]
) -> None:
    """16 producers through the proxy all deliver, a consumer through the proxy reads the 16
    records back, and the configured metrics port shows both workers' traffic."""
    topic = make_topic(1)
    sent = numbered("spread")
    assert produce_one_each(workers.bootstrap, topic, sent) == [None] * CONNECTIONS
    assert sorted(consume_through(workers.bootstrap, topic, CONNECTIONS, timeout=30)) == sent

    samples = workers.scrape()
    # SO_REUSEPORT hands each new connection to a worker by a hash of its addresses, as good as a
    # coin flip: all 16 producers' connections on one of the 2 workers has a chance of 2^-15.
    produced = by_worker(samples, "kvproxy_requests_total", api="produce")
    assert produced.get("0", 0) > 0 and produced.get("1", 0) > 0, produced
    records = by_worker(samples, "kvproxy_produce_records_total", topic=topic, outcome="accepted")
    assert sum(records.values()) == CONNECTIONS, records
    assert value(samples, "kvproxy_workers_running") == WORKERS
    assert by_worker(samples, "kvproxy_worker_restarts_total") == {"0": 0, "1": 0}

    status, text = workers.readyz()
    assert status == 200, text
    lines = text.splitlines()
    assert lines[0] == "ready", text
    for index in range(WORKERS):
        assert any(line.startswith(f"worker {index}: ready") for line in lines), text
    assert http_get(f"{workers.metrics_url}/healthz") == (200, "ok\n")


def test_rejected_records_are_journaled_per_worker_and_listed(
    workers: Supervisor, make_topic: Callable[..., str]
) -> None:
    """Records over the topic's size limit fail for the producer with MESSAGE_TOO_LARGE, land in
    `<quarantine.dir>/worker-<i>/` of the worker that refused them, and `kvproxy quarantine list`
    counts all of them."""
    topic = make_topic(1, prefix="too-big")
    refused = numbered("more than ten bytes")
    assert produce_one_each(workers.bootstrap, topic, refused) == [MSG_SIZE_TOO_LARGE] * CONNECTIONS

    journal = workers.journal_dir

    def journaled() -> dict[int, int] | None:
        counts = {
            index: sum(
                1 for e in JournalReader(journal / f"worker-{index}").entries() if e.topic == topic
            )
            for index in range(WORKERS)
        }
        return counts if sum(counts.values()) == CONNECTIONS else None

    counts = wait_until(journaled, f"{CONNECTIONS} journal entries", 15, workers.explain)
    assert all(counts[index] > 0 for index in range(WORKERS)), counts  # 2^-15, as above
    assert sorted(p.name for p in journal.iterdir() if p.is_dir()) == ["worker-0", "worker-1"]
    assert not list(journal.glob("*.kvq")), "every worker journals in its own folder"

    done = subprocess.run(
        [sys.executable, "-m", "kvproxy.cli", "quarantine", "list", "-c", str(workers.config_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done
    rows = [line.split() for line in done.stdout.splitlines() if topic in line]
    assert len(rows) == 1, done.stdout
    assert rows[0][:7] == [
        topic,
        "max_record_bytes",
        "10",
        "MESSAGE_TOO_LARGE",
        "rejected",
        str(CONNECTIONS),
        "0",
    ], done.stdout


def test_sighup_makes_every_worker_reload_the_rules(
    workers: Supervisor, make_topic: Callable[..., str]
) -> None:
    """A rule added to the file takes effect in every worker after one SIGHUP to the supervisor
    (the file is not watched: --reload-interval 0)."""
    topic = make_topic(1)
    assert produce_one_each(workers.bootstrap, topic, [b"accepted before the reload"]) == [None]
    reloads = "kvproxy_config_reloads_total"
    before = by_worker(workers.scrape(), reloads, result="success")

    workers.write_config(topics=[*workers.config["topics"], {"match": topic, **TOO_BIG_RULE}])
    workers.proc.send_signal(signal.SIGHUP)

    def reloaded() -> dict[str, float] | None:
        workers.assert_running()
        after = by_worker(workers.scrape(), reloads, result="success")
        done = all(after.get(str(i), 0) > before.get(str(i), 0) for i in range(WORKERS))
        return after if done else None

    wait_until(reloaded, "a successful reload in each worker", 30, workers.explain)
    samples = workers.scrape()
    assert sum(by_worker(samples, reloads, result="failure").values()) == 0
    assert value(samples, "kvproxy_workers_running") == WORKERS, "SIGHUP stops no worker"

    refused = numbered("refused after the reload")
    assert produce_one_each(workers.bootstrap, topic, refused) == [MSG_SIZE_TOO_LARGE] * CONNECTIONS
    rejections = by_worker(
        workers.scrape(), "kvproxy_policy_rejections_total", topic=topic, policy="max_record_bytes"
    )
    assert all(rejections.get(str(i), 0) > 0 for i in range(WORKERS)), rejections  # 2^-15


def test_a_killed_worker_is_restarted_and_serves_again(
    workers: Supervisor, make_topic: Callable[..., str]
) -> None:
    """SIGKILL to one worker: the other keeps serving, the supervisor starts a new worker in its
    place, counts the restart on /metrics, and the new worker takes connections."""
    topic = make_topic(1)
    running = workers.workers()
    assert sorted(running) == list(range(WORKERS)), running
    victim = running[1]
    victim.kill()
    wait_until(lambda: gone(victim), "the killed worker to be gone", 10)
    assert produce_one_each(workers.bootstrap, topic, [b"while worker 1 is down"]) == [None]

    def restarted() -> Samples | None:
        workers.assert_running()
        replacement = workers.workers().get(1)
        if replacement is None or replacement.pid == victim.pid:
            return None
        samples = workers.scrape()
        if value(samples, "kvproxy_workers_running") != WORKERS:
            return None
        if workers.readyz()[0] != 200:
            return None
        return samples

    samples = wait_until(restarted, "worker 1 to be restarted", 60, workers.explain)
    assert value(samples, "kvproxy_worker_restarts_total", worker="1") == 1
    assert value(samples, "kvproxy_worker_restarts_total", worker="0") == 0
    assert workers.workers()[0].pid == running[0].pid, "the other worker was left alone"
    assert f"worker 1 (pid {victim.pid}) exited with code -9: restarting it" in workers.log_text()

    accepted = "kvproxy_produce_records_total"
    before = by_worker(samples, accepted, topic=topic, outcome="accepted")
    sent = numbered("after the restart")
    assert produce_one_each(workers.bootstrap, topic, sent) == [None] * CONNECTIONS
    after = by_worker(workers.scrape(), accepted, topic=topic, outcome="accepted")
    # the new worker 1 started from zero: what it counts now came through it (2^-16 it is none)
    assert after.get("1", 0) > before.get("1", 0), (before, after)
    assert sum(after.values()) - sum(before.values()) == CONNECTIONS, (before, after)
    got = consume_through(workers.bootstrap, topic, CONNECTIONS + 1, timeout=30)
    assert sorted(got) == sorted([b"while worker 1 is down", *sent])


def test_sigterm_stops_the_supervisor_and_every_worker(workers: Supervisor) -> None:
    """SIGTERM to the supervisor: each worker drains and exits, then the supervisor exits 0;
    no worker process is left."""
    running = list(workers.workers().values())
    assert len(running) == WORKERS
    sent_at = time.monotonic()
    workers.proc.send_signal(signal.SIGTERM)
    try:
        code = workers.proc.wait(DRAIN_TIMEOUT_MS / 1000 + 20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the supervisor still runs 22 s after SIGTERM\n{workers.explain()}")
    assert code == 0, workers.explain()
    left = [p.pid for p in running if not gone(p)]
    assert left == [], f"workers left running: {left}"
    assert time.monotonic() - sent_at < DRAIN_TIMEOUT_MS / 1000 + 20
    text = workers.log_text()
    assert "stopping: SIGTERM to every worker" in text
    for index in range(WORKERS):
        assert f"kvproxy[worker {index}]: stopping: no new connections" in text, text
        assert f"kvproxy[worker {index}]: kvproxy stopped" in text, text
    assert text.rstrip().endswith("kvproxy: kvproxy stopped"), text  # the supervisor, last


# ---- processes of their own ----


def test_workers_stop_by_themselves_when_the_supervisor_is_killed(
    tansu: Broker, tmp_path: Path
) -> None:
    """SIGKILL to the supervisor (nothing passes SIGTERM on): its workers notice their parent is
    gone and exit within seconds instead of holding the ports."""
    with serve_workers(tmp_path, tansu) as supervisor:
        running = list(supervisor.workers().values())
        assert len(running) == WORKERS
        pid = supervisor.proc.pid
        supervisor.proc.kill()
        supervisor.proc.wait(10)
        killed_at = time.monotonic()
        wait_until(
            lambda: all(gone(p) for p in running),
            "the workers to exit",
            15,
            supervisor.explain,
        )
        assert time.monotonic() - killed_at < 15
        text = supervisor.log_text()
        for index in range(WORKERS):
            assert (
                f"kvproxy[worker {index}]: the supervisor (pid {pid}) is gone: stopping this worker"
                in text
            ), text


def test_a_sighup_while_the_workers_start_does_not_stop_kvproxy(
    tansu: Broker, tmp_path: Path
) -> None:
    """A SIGHUP that arrives while the workers are still starting (a reload sent right after a
    deploy, say) neither stops `kvproxy serve` nor kills a worker: it comes up and serves."""
    with serve_workers(tmp_path, tansu, ready=False) as supervisor:
        wait_until(
            lambda: f"worker {WORKERS - 1} started" in supervisor.log_text(),
            "the supervisor to start its workers",
            START_TIMEOUT_S,
            supervisor.explain,
        )
        supervisor.proc.send_signal(signal.SIGHUP)  # the workers are still importing
        supervisor.wait_ready()
        samples = supervisor.scrape()
        assert value(samples, "kvproxy_workers_running") == WORKERS
        assert by_worker(samples, "kvproxy_worker_restarts_total") == {"0": 0, "1": 0}, (
            supervisor.explain()
        )


def test_what_cannot_run_as_several_workers_is_refused_with_exit_2(tmp_path: Path) -> None:
    """`--workers 2` with an embedded broker or with listen.port 0, and `--workers 0`, exit 2
    with the reason on stderr and start nothing."""
    upstream = {"bootstrap_servers": ["127.0.0.1:9"]}
    listen = {"host": HOST, "port": free_port(), "broker_port_base": free_port_range(20)}
    cases = {
        "embedded": (
            {"listen": listen, "upstream": {"embedded": True}},
            "2",
            "kvproxy: --workers needs an upstream cluster: each worker would start its own "
            "embedded broker",
        ),
        "port-0": (
            {"listen": {**listen, "port": 0}, "upstream": upstream},
            "2",
            "kvproxy: --workers needs a fixed listen.port",
        ),
        "zero": (
            {"listen": listen, "upstream": upstream},
            "0",
            "kvproxy: --workers must be at least 1, not 0",
        ),
    }
    started: dict[str, subprocess.Popen[str]] = {}
    try:
        for name, (config, count, _) in cases.items():  # at once: each start costs seconds
            path = tmp_path / f"{name}.yaml"
            path.write_text(yaml.safe_dump(config))
            started[name] = subprocess.Popen(
                [sys.executable, "-m", "kvproxy.cli", "serve", "-c", str(path), "--workers", count],
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        for name, (_, _, message) in cases.items():
            _, stderr = started[name].communicate(timeout=60)
            assert started[name].returncode == 2, f"{name}: {stderr}"
            assert stderr.startswith(message), f"{name}: {stderr}"
            assert "started" not in stderr, f"{name}: {stderr}"
    finally:
        for proc in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
