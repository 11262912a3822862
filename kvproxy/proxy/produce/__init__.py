"""One Produce request from its read to its answer: the exchange, where it is decided, the
engine that runs the policies per partition, and the answer merged with the broker's."""
