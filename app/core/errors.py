"""The one root of nodeledger's errors.

Every error the service raises on purpose (the ledger's, the guard's, the Slurm and
Kubernetes clients') is a ``NodeledgerError``, and says as data what any caller needs to
know about it, so that each caller decides once, on the data, not on a list of classes:

- ``code``: a stable machine name (the API's ``code``; docs/api.md lists them);
- ``http_status``: the HTTP status it is answered with when it reaches a route (mapped in
  one place, app.api.errors);
- ``retryable``: whether the same call may succeed later (the API's ``retryable``);
- ``unavailable``: a dependency did not answer (an outage, logged once by app.outages,
  not a bug with a traceback).

``http_status`` is not named ``status``: the client errors keep theirs for the status the
dependency answered with. The attributes are plain class attributes that an instance may
set when they depend on what happened (app.kube.client.KubeError).
"""

from __future__ import annotations


class NodeledgerError(Exception):
    code: str = "internal_error"
    http_status: int = 500
    retryable: bool = False
    unavailable: bool = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class DependencyError(NodeledgerError):
    """slurmrestd or the Kubernetes API failed, refused or did not answer. Such an error
    reaches no route today (the admission gate turns it into a refusal): were one to, it
    would be a 502, or a retryable 503 when the dependency is away."""

    code = "dependency_error"
    http_status = 502
