"""Where clients connect: the listening ports, TLS and SNI acceptance, the connection and
handshake limits, and the sweep that closes idle connections."""
