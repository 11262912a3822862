"""kvproxy, a Kafka validation proxy: the one top-level package everything installs under.

Each layer is a subpackage (`kvproxy.protocol`, `kvproxy.policies`, ..., `kvproxy.commands`; in the
repository, a link to the folder of that name); `kvproxy.cli` is the `kvproxy` command.
"""
