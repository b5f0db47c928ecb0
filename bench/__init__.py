"""Benchmarks that print their figures as JSON, run as scenarios of one harness:
`python -m bench` lists them (bench/scenarios.toml: entry point, arguments, thresholds with
their provenance) and `python -m bench NAME` runs one and checks its figures. Run from the
repository's root, which puts the root on sys.path, so the benchmarks import the tests'
helpers (``tests.support``, through ``bench._fixtures``) as the package they are.

- ``_stats``: the one percentile, summary and timer;
- ``_fixtures``: the test cluster, services and requests the benches share;
- ``_scenarios``: the scenarios file and the checker;
- one module per bench, each with ``main(argv)``; ``python -m bench.<name>`` still runs
  one alone, unchecked.
"""
