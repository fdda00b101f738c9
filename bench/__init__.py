"""Benchmarks of imroute on one machine; run each from the repository root as
`.venv/bin/python -m bench.<name>` (see docs/benchmarks/index.md)."""
