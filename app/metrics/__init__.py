"""Prometheus metrics on a registry of the app's own, and the per-node ledger collector.
The /metrics route and request ids are app.api.routes_metrics'; log lines, app.logs'.

The metric names, types and labels are a contract (alerts and dashboards are written
against them): see ``registry`` and docs/operations.md#metrics.
"""
