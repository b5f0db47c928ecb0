"""Benchmarks that print their figures as JSON (run with `python -m bench.<name>`)."""
