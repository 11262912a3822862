"""Schema-registry validation: the Confluent wire format, the registry's answers as values, and
the per-format payload checks. Pure: the proxy and the audit fetch schemas; this package reads
them."""
