"""What can go wrong talking to slurmrestd, as one error tree.

``SlurmUnavailable`` (transport failure, timeout, 5xx without Slurm errors) and
``SlurmAuthError`` (401/511) mean "Slurm cannot answer now": admissions fail closed, the
sync retries next interval. ``SlurmRequestError`` carries Slurm's own error numbers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SlurmErrorDetail:
    error_number: int
    error: str
    description: str = ""

    def __str__(self) -> str:
        text = f"{self.error} ({self.error_number})"
        return f"{text}: {self.description}" if self.description else text


class SlurmError(Exception):
    retryable = False

    def __init__(
        self, message: str, *, status: int | None = None, errors: tuple[SlurmErrorDetail, ...] = ()
    ) -> None:
        detail = "; ".join(str(e) for e in errors)
        super().__init__(f"{message}: {detail}" if detail else message)
        self.message = str(self)
        self.status = status
        self.errors = errors


class SlurmUnavailable(SlurmError):
    """slurmrestd did not answer (connection refused, timeout) or failed without saying why."""

    retryable = True


class SlurmAuthError(SlurmError):
    """slurmrestd refused the token (HTTP 401 missing, 511 invalid or expired)."""

    retryable = True  # a rotated token file fixes it without a restart


class SlurmRequestError(SlurmError):
    """Slurm understood and refused the request (unknown node, invalid user, ...)."""
