"""What operators read: Prometheus metrics and their label bounds, log formatting and the
limits on lines a peer can cause, file-descriptor and memory upkeep."""
