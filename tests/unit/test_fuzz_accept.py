"""The compiled fast accept under libFuzzer with AddressSanitizer and UndefinedBehaviorSanitizer
(fuzz/accept_fuzz.c): the C that reads the bytes a client controls, run on the committed corpus
(fuzz/corpus/accept: the golden captures, the fuzz corpus's Produce requests and a few made for
it) and what libFuzzer mutates from it, for `KVPROXY_ACCEPT_FUZZ_SECONDS` (20 s here; `make
fuzz` runs it for 10 minutes). An out-of-bounds read, an overflow or an accepted request whose
counts do not add up fails the test with the sanitizer's report and the input that caused it.

clang and its sanitizer runtimes come from `make test` (`apt-get install clang libclang-rt-dev`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "fuzz" / "accept_fuzz.c"
CORPUS = ROOT / "fuzz" / "corpus" / "accept"
SECONDS = int(os.environ.get("KVPROXY_ACCEPT_FUZZ_SECONDS", "20"))


def test_the_fast_accept_survives_the_fuzzer(tmp_path: Path) -> None:
    clang = shutil.which("clang")
    assert clang is not None, "clang is missing: `make test` installs it (clang libclang-rt-dev)"
    binary = tmp_path / "accept_fuzz"
    subprocess.run(
        [clang, "-g", "-O1", "-fsanitize=fuzzer,address,undefined",
         "-fno-sanitize-recover=undefined", str(HARNESS), "-o", str(binary)],
        check=True,
    )  # fmt: skip
    found = tmp_path / "found"  # new inputs go here: the committed corpus is only read
    found.mkdir()
    run = subprocess.run(
        [str(binary), f"-max_total_time={SECONDS}", "-timeout=5", "-rss_limit_mb=2048",
         "-print_final_stats=1", f"-artifact_prefix={tmp_path}/", str(found), str(CORPUS)],
        capture_output=True,
        text=True,
        timeout=SECONDS + 120,
        check=False,  # its report is read below
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    executed = re.search(r"stat::number_of_executed_units:\s*(\d+)", run.stderr)
    assert executed is not None, run.stderr[-2000:]
    assert int(executed.group(1)) > 10_000  # it ran, on more than the corpus
    seeds = len(list(CORPUS.iterdir()))
    assert seeds >= 200
