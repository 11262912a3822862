"""The schema registry, asked over its REST API (Confluent's): the proxy's cache of its answers
and the audit driver's one-off fetch share this code."""
