"""Record a real librdkafka SASL/PLAIN exchange against the SASL stub (see README.md here).

Run from the repository root: ``.venv/bin/python tests/golden/sasl/capture.py``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

USER, PASSWORD = "alice", "alice-secret"
NAMES = {18: "api-versions", 17: "sasl-handshake", 36: "sasl-authenticate", 3: "metadata"}


def capture(variant: str, password: str) -> list[dict[str, object]]:
    from confluent_kafka import Producer

    from tests.harness.stub_upstream import run_stub_cluster

    with run_stub_cluster(node_ids=(1,), sasl_plain={USER: PASSWORD}) as cluster:
        producer = Producer(
            {
                "bootstrap.servers": cluster.bootstrap,
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN",
                "sasl.username": USER,
                "sasl.password": password,
                "client.id": "kvproxy-golden",
                "reconnect.backoff.max.ms": 10000,
                "reconnect.backoff.ms": 10000,
            }
        )
        if variant == "ok":
            producer.list_topics(timeout=3)
        else:
            producer.poll(1.0)
        frames = cluster.frames(1)
    out = []
    for i, (request, answer) in enumerate(frames):
        api_key = int.from_bytes(request[0:2], "big", signed=True)
        api_version = int.from_bytes(request[2:4], "big", signed=True)
        if api_key not in NAMES:
            continue
        stem = f"librdkafka-plain-{variant}-{i:02d}-{NAMES[api_key]}-v{api_version}"
        (HERE / f"{stem}.request.bin").write_bytes(request)
        if answer is not None:
            (HERE / f"{stem}.response.bin").write_bytes(answer)
        out.append({"file": stem, "api_key": api_key, "api_version": api_version})
        if api_key == 36:
            break  # the SASL part ends with the first SaslAuthenticate
    return out


def main() -> None:
    import confluent_kafka

    for old in HERE.glob("librdkafka-plain-*.bin"):
        old.unlink()
    index = {
        "client": "confluent-kafka",
        "client_version": confluent_kafka.__version__,
        "librdkafka_version": confluent_kafka.libversion()[0],
        "user": USER,
        "password": PASSWORD,
        "ok": capture("ok", PASSWORD),
        "bad-password": capture("bad", "wrong-password"),
    }
    (HERE / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    print(json.dumps(index, indent=1))


if __name__ == "__main__":
    main()
