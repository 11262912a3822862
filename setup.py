"""The compiled parts: the record skim (kvproxy/protocol/records/_skim.c; its twin is
records/skim.py) and the fast accept of Produce requests (kvproxy/protocol/fast_accept/, whose
twin answers "not sure" and leaves every request to the Python path).

Everything else about the package is in pyproject.toml. The extensions are optional: where no C
compiler is found the install goes on without them and the pure-Python paths run.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kvproxy.protocol.records._skim",
            sources=["kvproxy/protocol/records/_skim.c"],
            depends=["kvproxy/protocol/valid_utf8.h"],
            optional=True,
        ),
        Extension(
            "kvproxy.protocol.fast_accept._accept",
            sources=[
                "kvproxy/protocol/fast_accept/_accept.c",
                "kvproxy/protocol/fast_accept/accept_core.c",
                "kvproxy/protocol/fast_accept/crc32c.c",
            ],
            depends=[
                "kvproxy/protocol/fast_accept/accept_core.h",
                "kvproxy/protocol/valid_utf8.h",
            ],
            optional=True,
        ),
    ]
)
