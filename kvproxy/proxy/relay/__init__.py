"""One client connection and its broker side: frames in, answers back in request order, the
slots, the reading and receive-memory flow control, and the upstream dial."""
