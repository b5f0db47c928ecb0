"""Benchmarks that print their figures as JSON: run `python -m bench.<name>` from the
repository's root, which puts the root on sys.path, so the benchmarks import the tests'
helpers (``tests.support``) as the package they are, with no path of their own."""
