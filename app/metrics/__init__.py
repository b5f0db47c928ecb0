"""Observability: Prometheus metrics on a registry of the app's own, the per-node ledger
collector, the /metrics route, request ids and structured (JSON) log lines.

The metric names, types and labels are a contract (alerts and dashboards are written
against them): see ``registry`` and docs/operations.md ("Metrics", "Logs").
"""
