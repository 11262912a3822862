"""The vendored copy of the shared golden segments is byte-for-byte the original."""

from __future__ import annotations

import hashlib

from tests.harness.records_testdata import TESTDATA


def _manifest() -> dict[str, str]:
    lines = (TESTDATA / "SHA256SUMS").read_text().splitlines()
    return {name: digest for digest, name in (line.split() for line in lines)}


def test_vendored_segments_match_their_checksums() -> None:
    manifest = _manifest()
    assert len(manifest) == 4
    found = sorted(str(p.relative_to(TESTDATA)) for p in TESTDATA.glob("kafka-logs/*/*.log"))
    assert found == sorted(manifest)
    for name, digest in manifest.items():
        assert hashlib.sha256((TESTDATA / name).read_bytes()).hexdigest() == digest, name
