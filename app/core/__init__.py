"""The pure core: decisions and texts over immutable values, no I/O (no database, no
network, no clock). Everything that decides whether a holding is admitted lives here, so
that the ledger, the scheduler extender, the Slurm gate and the metrics cannot disagree."""
