"""The proxy's view of the cluster: which brokers it has and where clients reach them, the
Metadata refresh, readiness, and the answers rewritten to name the proxy's addresses."""
