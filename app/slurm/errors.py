"""What can go wrong talking to slurmrestd, as one error tree.

``SlurmUnavailable`` (transport failure, timeout, 5xx without Slurm errors) and
``SlurmAuthError`` (401/511) mean "Slurm cannot answer now" (``retryable``): admissions fail
closed, the sync retries next interval. ``SlurmRequestError`` carries Slurm's own error
numbers. ``status`` is the HTTP status slurmrestd answered with, when it answered.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.core.errors import DependencyError


@dataclass(frozen=True, slots=True)
class SlurmErrorDetail:
    error_number: int
    error: str
    description: str = ""

    def __str__(self) -> str:
        text = f"{self.error} ({self.error_number})"
        return f"{text}: {self.description}" if self.description else text


class SlurmError(DependencyError):
    code = "slurm_error"

    def __init__(
        self, message: str, *, status: int | None = None, errors: tuple[SlurmErrorDetail, ...] = ()
    ) -> None:
        detail = "; ".join(str(e) for e in errors)
        super().__init__(f"{message}: {detail}" if detail else message)
        self.status = status
        self.errors = errors


class SlurmUnavailable(SlurmError):
    """slurmrestd did not answer (connection refused, timeout) or failed without saying why."""

    code = "slurm_unavailable"
    http_status = 503
    retryable = True
    unavailable = True


class SlurmAnswerLost(SlurmUnavailable):
    """The request went out but its answer never came (read timeout, connection cut): an
    update may still be applied later, after anything sent since: it proves neither that
    the update failed nor that it applied."""

    code = "slurm_answer_lost"


class SlurmAuthError(SlurmError):
    """slurmrestd refused the token (HTTP 401 missing, 511 invalid or expired)."""

    code = "slurm_auth_refused"
    http_status = 503
    retryable = True  # a rotated token file fixes it without a restart


class SlurmRequestError(SlurmError):
    """Slurm understood and refused the request (unknown node, invalid user, ...)."""

    code = "slurm_request_refused"
