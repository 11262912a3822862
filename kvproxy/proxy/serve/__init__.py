"""Running the proxy: build its parts, serve, reload the rules, drain and stop; the worker
processes, the signals, the embedded development broker."""
