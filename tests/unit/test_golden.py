"""Golden ProduceRequest frames captured from real clients (see tests/golden/README.md).

Every file must decode, carry the Produce version its name says, re-encode to identical bytes, and
hold exactly the records the capture script sent (JSON sidecar), in valid batches.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kvproxy.protocol import messages
from kvproxy.protocol import records as records_mod

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
FILES = sorted(GOLDEN.glob("*-produce-v*.bin"))
NAME = re.compile(r"^(?P<client>[a-z-]+?)-produce-v(?P<version>\d+)-(?P<variant>[a-z0-9-]+)\.bin$")


def _sidecar(path: Path) -> dict[str, Any]:
    return json.loads(path.with_suffix(".json").read_text())


def _codec_name(codec: Any) -> str:
    name = getattr(codec, "name", codec)
    return str(name).lower()


def _enc(s: str | None) -> bytes | None:
    return None if s is None else s.encode()


def test_golden_set_is_present() -> None:
    assert len(FILES) >= 20
    clients = {NAME.match(f.name)["client"] for f in FILES}  # type: ignore[index]
    assert clients == {"confluent", "kafka-python", "aiokafka"}
    for f in FILES:
        assert f.with_suffix(".json").exists(), f"{f.name} has no JSON sidecar"


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_golden_roundtrip(path: Path) -> None:
    payload = path.read_bytes()
    m = NAME.match(path.name)
    assert m, path.name
    req = messages.decode_request(payload)
    assert req.header.api_key == 0
    assert req.header.api_version == int(m["version"])
    assert req.header.api_version == _sidecar(path)["api_version"]
    assert messages.encode_request(req) == payload


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_golden_records(path: Path) -> None:
    expected = _sidecar(path)
    req = messages.decode_request(path.read_bytes())
    assert req.body.acks == expected["acks"]
    transactional_id = getattr(req.body, "transactional_id", None)
    assert (transactional_id is not None) == expected["transactional"]

    got: dict[str, dict[str, list[list[Any]]]] = {}
    for topic in req.body.topic_data:
        for part in topic.partition_data:
            assert part.records is not None
            batches = list(records_mod.iter_batches(part.records))
            assert batches, f"{topic.name}/{part.index}: no batch"
            rows = got.setdefault(str(topic.name), {}).setdefault(str(part.index), [])
            for batch in batches:
                assert batch.crc_valid(), f"{topic.name}/{part.index}: bad CRC"
                assert batch.magic == expected["magic"]
                assert _codec_name(batch.codec) == expected["compression"]
                if expected["magic"] == 2:
                    assert len(batches) == 1  # v3+: exactly one batch per partition
                    assert (batch.producer_id >= 0) == expected["idempotent"]
                    assert batch.is_transactional == expected["transactional"]
                rows.extend(
                    [r.key, r.value, [[hk, hv] for hk, hv in r.headers]] for r in batch.records()
                )

    want = {
        t: {
            p: [[_enc(k), _enc(v), [[hk, _enc(hv)] for hk, hv in hs]] for k, v, hs in recs]
            for p, recs in parts.items()
        }
        for t, parts in expected["topics"].items()
    }
    assert got == want
