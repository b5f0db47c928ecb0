"""The Slurm side: slurmrestd client, Slurm -> ledger sync, ledger -> Slurm GRES push."""
