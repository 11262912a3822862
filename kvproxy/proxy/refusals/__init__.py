"""Where refused records go: the rejection log, the metrics and the journal (one sink per
decided request), and the dead-letter copies sent in the background."""
