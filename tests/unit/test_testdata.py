"""The vendored copy of the shared golden segments is byte-for-byte the original."""

from __future__ import annotations

import hashlib

from tests.unit.records_testdata import SHARED_TESTDATA, TESTDATA


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


def test_vendored_segments_equal_the_shared_originals_when_present() -> None:
    """Beside a development checkout the shared originals exist; in a lone clone there is no copy
    to compare, and the checksum test above is what pins the bytes."""
    originals = sorted(SHARED_TESTDATA.glob("kafka-logs/*/*.log"))
    for original in originals:
        copy = TESTDATA / original.relative_to(SHARED_TESTDATA)
        assert copy.read_bytes() == original.read_bytes(), copy
    assert len(originals) in (0, len(_manifest()))
