"""What a Produce decision must learn from the cluster first: topic settings, topic ids and
schema ids, each within a bound on how often a client can make the proxy ask."""
