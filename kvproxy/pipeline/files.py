"""Where the audit's input files live: local paths, `file://` URIs, or any fsspec filesystem.

Local files need nothing beyond the standard library. Other URIs (`hdfs://`, `s3a://`, `gs://`,
...) are opened with fsspec, which must then be installed with the filesystem's own package on
the driver and on every executor: the tasks read their byte ranges themselves, so nothing but
the range boundaries travels through Spark.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import IO, Any
from urllib.parse import urlparse

__all__ = [
    "InputError",
    "absolute",
    "is_dir",
    "list_dir",
    "open_binary",
    "read_range",
    "size",
    "write_text",
]


class InputError(Exception):
    """An input that cannot be read: the message names it and says why."""


def _local(uri: str) -> str | None:
    """The local path of `uri`, or None when it names another filesystem."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and os.name == "nt"):
        return parsed.path if parsed.scheme == "file" else uri
    return None


def local_path(uri: str) -> str | None:
    """The local path of `uri`, or None when it names another filesystem."""
    return _local(uri)


def _fs(uri: str) -> Any:
    try:
        import fsspec  # noqa: PLC0415  (optional: only for non-local inputs)
    except ImportError:
        scheme = urlparse(uri).scheme
        raise InputError(
            f"{uri}: reading {scheme}:// inputs needs fsspec and the filesystem's package "
            "(for example pyarrow for hdfs://, s3fs for s3a://) on the driver and the executors"
        ) from None
    try:
        fs, _ = fsspec.core.url_to_fs(uri)
    except (ImportError, ValueError) as exc:  # an unknown scheme, or its package is missing
        raise InputError(f"cannot read {uri}: {exc}") from None
    return fs


def _describe(uri: str, exc: OSError) -> InputError:
    reason = exc.strerror or str(exc)
    return InputError(f"cannot read {uri}: {reason}")


def absolute(uri: str) -> str:
    """A local path made absolute (executors on other machines or folders resolve it the same);
    URIs as they are."""
    if urlparse(uri).scheme == "" and _local(uri) is not None:
        return os.path.abspath(uri)
    return uri


def is_dir(uri: str) -> bool:
    path = _local(uri)
    if path is not None:
        if not os.path.exists(path):
            raise InputError(f"cannot read {uri}: no such file or directory")
        return os.path.isdir(path)
    try:
        return bool(_fs(uri).isdir(uri))
    except OSError as exc:
        raise _describe(uri, exc) from exc


def list_dir(uri: str) -> Iterator[str]:
    """The entries of a directory as URIs of the same kind, sorted by name."""
    path = _local(uri)
    try:
        if path is not None:
            names = sorted(os.listdir(path))
            prefix = uri.rstrip("/")
            yield from (f"{prefix}/{name}" for name in names)
            return
        fs = _fs(uri)
        scheme = urlparse(uri).scheme
        for entry in sorted(fs.ls(uri, detail=False)):
            text = str(entry)
            yield text if "://" in text else f"{scheme}://{text.lstrip('/')}"
    except OSError as exc:
        raise _describe(uri, exc) from exc


def size(uri: str) -> int:
    path = _local(uri)
    try:
        if path is not None:
            return os.path.getsize(path)
        return int(_fs(uri).size(uri))
    except OSError as exc:
        raise _describe(uri, exc) from exc


def open_binary(uri: str) -> IO[bytes]:
    """A seekable binary file (buffered: the header scan reads a few bytes per batch)."""
    path = _local(uri)
    try:
        if path is not None:
            return open(path, "rb")
        return _fs(uri).open(uri, "rb")  # type: ignore[no-any-return]
    except OSError as exc:
        raise _describe(uri, exc) from exc


def read_range(uri: str, start: int, end: int) -> bytes:
    """Bytes [start, end) of a file; InputError when fewer are there (the file shrank)."""
    with open_binary(uri) as handle:
        handle.seek(start)
        data = handle.read(end - start)
    if len(data) != end - start:
        raise InputError(
            f"cannot read {uri}: bytes {start}-{end} were planned but the file ends at "
            f"{start + len(data)} (it changed during the audit)"
        )
    return data


def write_text(uri: str, text: str) -> None:
    """Write a small output file (summary, report), creating its folder."""
    path = _local(uri)
    try:
        if path is not None:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
            return
        with _fs(uri).open(uri, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        raise InputError(f"cannot write {uri}: {exc.strerror or exc}") from exc
