"""Whether the compiled parts may be used: the record skim (`records/_skim.c`) and the fast
accept of Produce requests (`fast_accept/`). `KVPROXY_NO_EXTENSIONS=1` forces their pure-Python
twins, as `AIOKAFKA_NO_EXTENSIONS` does aiokafka's: the same answers, found the slower way (the
fast accept's twin answers "not sure" to every request, so the Python path decides all of them).
"""

from __future__ import annotations

import os

__all__ = ["NO_EXTENSIONS_VARIABLE", "extensions_allowed"]

NO_EXTENSIONS_VARIABLE = "KVPROXY_NO_EXTENSIONS"


def extensions_allowed() -> bool:
    """False when the environment asks for the pure-Python twins (any value but "" and "0")."""
    return os.environ.get(NO_EXTENSIONS_VARIABLE, "") in ("", "0")
