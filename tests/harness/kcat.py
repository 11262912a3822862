"""Run kcat, the command-line Kafka client, against a current librdkafka.

Debian's kcat 1.7.1 links the system librdkafka 2.0.2, which cannot parse the ApiVersions v3
answer of Tansu 0.6 ("Read underflow ... at 274/279"; Tansu sends the FinalizedFeaturesEpoch tag
explicitly). kcat is linked dynamically, so the tests run the same kcat binary with the librdkafka
that the confluent-kafka wheel bundles (2.16 today), found through LD_LIBRARY_PATH.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import confluent_kafka


@functools.cache
def _librdkafka_dir() -> str:
    libs = Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
    candidates = sorted(libs.glob("librdkafka*.so*"))
    if not candidates:
        raise RuntimeError(f"no bundled librdkafka found in {libs}")
    link_dir = Path(tempfile.mkdtemp(prefix="kvproxy-librdkafka-"))
    (link_dir / "librdkafka.so.1").symlink_to(candidates[0])
    return str(link_dir)


def kcat_binary() -> str:
    path = shutil.which("kcat")
    if path is None:
        raise RuntimeError("kcat is not installed (make test installs it with apt-get)")
    return path


def run_kcat(
    args: list[str], *, input_bytes: bytes | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[bytes]:
    """Run kcat with `args`; the result carries stdout/stderr as bytes."""
    env = dict(os.environ, LD_LIBRARY_PATH=_librdkafka_dir())
    return subprocess.run(
        [kcat_binary(), *args],
        input=input_bytes,
        capture_output=True,
        check=False,
        timeout=timeout,
        env=env,
    )


def librdkafka_version() -> str:
    """The librdkafka version kcat reports it runs on."""
    out = run_kcat(["-V"]).stdout.decode()
    marker = "librdkafka "
    start = out.index(marker) + len(marker)
    return out[start:].split()[0]
