"""The benchmarks of kvproxy (docs/benchmarks.md), each run as `python -m bench.<name>`."""
