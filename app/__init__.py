"""nodeledger: a per-node resource ledger shared by Kubernetes pods and Slurm jobs."""

__version__ = "0.1.0"
