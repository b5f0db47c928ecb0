"""Helpers of bench.chaos_kills: replicas killed and restarted, the racing load, the
samplers that watch the invariant while it runs, and the checks after it."""
