"""The offline commands of `kvproxy`: serve and check wiring, demo, dump, quarantine, topics."""
