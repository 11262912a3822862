"""The server names of the SNI listener: the bootstrap's name and a pattern naming each broker.

One TLS port serves every broker; the name a client sends in its TLS hello (SNI) says which.
`SniNames.name_of` gives the name answers to clients carry for a node, `SniNames.route` reads a
name back into the node it stands for. Names are DNS names compared case-insensitively, with one
trailing dot ignored; anything else a client sends (non-ASCII, a node id with a leading zero or
too large to be one) matches nothing, so a hostile name never reaches a broker.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Final

NODE_ID: Final = "$(nodeId)"
"""Where the node id goes in the brokers' name pattern."""
MAX_NODE_ID: Final = 2**31 - 1
"""Kafka's node ids are int32."""
_MAX_NODE_DIGITS: Final = len(str(MAX_NODE_ID))
_MAX_NAME: Final = 253
_LABEL: Final = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_DIGITS: Final = frozenset("0123456789")


class NoRoute(enum.Enum):
    """A server name that names neither the bootstrap nor a broker."""

    NO_ROUTE = "no_route"


NO_ROUTE: Final = NoRoute.NO_ROUTE


def dns_name_problem(name: str) -> str | None:
    """Why `name` (lower-case, no trailing dot) is not a DNS host name; None when it is one."""
    if not name:
        return "is empty"
    if len(name) > _MAX_NAME:
        return f"is {len(name)} characters long (a DNS name has at most {_MAX_NAME})"
    for label in name.split("."):
        if not label:
            return "has an empty label (two dots in a row, or a leading dot)"
        if len(label) > 63:
            return f"has a label of {len(label)} characters (at most 63): {label[:20]}..."
        if not (label.isascii() and _LABEL.fullmatch(label)):
            return (
                f"has the label {label!r}: labels are letters a-z, digits and '-', "
                "not starting or ending with '-'"
            )
    return None


def normal_name(name: str) -> str:
    """The name as compared: lower-case, without one trailing dot (ASCII only is lowered, so a
    non-ASCII letter never folds into an ASCII one)."""
    name = name.removesuffix(".")
    return name.lower() if name.isascii() else name


@dataclass(frozen=True, slots=True)
class SniNames:
    """The bootstrap's server name and the brokers' pattern (both lower-case, validated by
    `kvproxy.proxy.config.listen_config.ListenSni`)."""

    bootstrap: str
    brokers: str
    """The pattern, with one `$(nodeId)`."""

    def name_of(self, node_id: int) -> str:
        """The server name of node `node_id` ("broker-3.kafka.example.com")."""
        return self.brokers.replace(NODE_ID, str(node_id))

    def route(self, server_name: str) -> int | NoRoute | None:
        """The node `server_name` names: None for the bootstrap, the node id for a broker,
        NO_ROUTE for a name that matches neither."""
        name = server_name.removesuffix(".")
        if not name.isascii():
            return NO_ROUTE
        name = name.lower()
        if name == self.bootstrap:
            return None
        node_id = self.broker_of(name)
        return NO_ROUTE if node_id is None else node_id

    def broker_of(self, name: str) -> int | None:
        """The node id a normal name (`normal_name`) matching the brokers' pattern stands for;
        None when it does not match (a node id with a leading zero or past int32 does not)."""
        prefix, suffix = self.brokers.split(NODE_ID)
        if len(name) <= len(prefix) + len(suffix):
            return None
        if not (name.startswith(prefix) and name.endswith(suffix)):
            return None
        digits = name[len(prefix) : len(name) - len(suffix)]
        if len(digits) > _MAX_NODE_DIGITS or not _DIGITS.issuperset(digits):
            return None
        if digits[0] == "0" and digits != "0":
            return None
        node_id = int(digits)
        return node_id if node_id <= MAX_NODE_ID else None
