"""The record skim compiled (kvproxy/protocol/records/_skim.c; its twin is records/skim.py).

Everything else about the package is in pyproject.toml. The extension is optional: where no C
compiler is found the install goes on without it and the pure-Python skim runs.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kvproxy.protocol.records._skim",
            sources=["kvproxy/protocol/records/_skim.c"],
            optional=True,
        )
    ]
)
