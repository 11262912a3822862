"""The fast accept of Produce requests: a conservative accelerator, never a judge.

`accept_produce(frame, form_of, now_ms, max_partitions, max_records, max_request_records)` makes
one pass over a Produce request (v3-v13: the header, the topics and partitions, each partition's
batch header and CRC32C, every record walked) and answers only "every partition passes every
check its topic's chain asks for (`form_of`), and here are the counts the metrics need", as
`(api_version, correlation_id, acks, ((topic, partitions, records), ...))`, or None: "not sure".
A refusal, a topic without a compiled form, a version, codec, acks or size it does not handle:
all None, and the Python path decides and words the answer, as it would without this module.

`form_of(topic)` gets a topic's name (a str) or, in Produce v13, its id (16 bytes), and answers
None or `(name, (max_batch_bytes, max_partition_bytes, before_max_ms, after_max_ms,
keys_required))`, -1 where no limit applies (`kvproxy.policies.accept_form.AcceptForm.fields`).

The invariant, held by the property tests: an accept here implies the Python path accepts
every partition and forwards the request unchanged. The compiled code is `accept_core.c` (plain
C, fuzzed with libFuzzer and AddressSanitizer: fuzz/accept_fuzz.c) behind `_accept.c`; its
twin here answers None to everything: with no compiler at install, or
`KVPROXY_NO_EXTENSIONS=1` (`kvproxy.protocol.compiled`), every request takes the Python path.
"""

from __future__ import annotations

from collections.abc import Callable

from kvproxy.protocol.compiled import extensions_allowed
from kvproxy.protocol.framing import Frame

__all__ = [
    "COMPILED",
    "Accepted",
    "FormFields",
    "FormOf",
    "accept_produce",
    "answer_plain",
    "python_accept_produce",
    "python_answer_plain",
]

FormFields = tuple[int, int, int, int, int]
"""(max batch bytes, max partition bytes, before max ms, after max ms, keys required); -1: none."""
FormOf = Callable[[str | bytes], tuple[str, FormFields] | None]
Accepted = tuple[int, int, int, tuple[tuple[str, int, int], ...]]
"""(api version, correlation id, acks, each topic's (name, partitions, records))."""
AcceptProduce = Callable[[Frame, FormOf, int, int, int, int], Accepted | None]


def python_accept_produce(  # noqa: PLR0917 (the C function's positional signature)
    frame: Frame,
    form_of: FormOf,
    now_ms: int,
    max_partitions: int,
    max_records: int,
    max_request_records: int,
) -> Accepted | None:
    """The twin without a compiler: never sure, so the Python path decides every request."""
    return None


def python_answer_plain(frame: Frame, version: int) -> bool:
    """The twin of the compiled answer scan: never sure (the Python scan decides)."""
    return False


def _compiled() -> tuple[AcceptProduce, Callable[[Frame, int], bool]] | None:
    if not extensions_allowed():
        return None
    try:
        from kvproxy.protocol.fast_accept import _accept  # noqa: PLC0415
    except ImportError:
        return None
    return _accept.accept_produce, _accept.answer_plain


_built = _compiled()
COMPILED: bool = _built is not None
"""Whether `accept_produce` is the compiled one (the proxy says which at start-up)."""
accept_produce: AcceptProduce = python_accept_produce if _built is None else _built[0]
answer_plain: Callable[[Frame, int], bool] = python_answer_plain if _built is None else _built[1]
"""True when a flexible Produce answer (v9-v13) plainly names no broker: no tagged field
anywhere, its bytes read to their end (`accept_core.c:kva_answer_plain`); False when not sure,
and `kvproxy.protocol.produce_shape.answer_names_nodes` scans it in Python."""
