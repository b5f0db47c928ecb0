"""schemathesis against a real `nodeledger serve`, from the OpenAPI document it serves,
scheduler extender included: no response >= 500 and none that the document does not
describe (status code, content type, body schema), whatever a caller sends.

Two targets, pairwise over what changes the answers:

- ``auth-none-sqlite``: no authentication, SQLite;
- ``auth-static-postgresql``: static tokens, reads protected too, PostgreSQL (where NUL
  characters, 64-bit ids and far-away times behave differently).

Both run with the Kubernetes integration on, against the real test control plane, with a
node selector that matches no Node (the service creates no Kubernetes object): the
extender routes are live, and bind asks the real API server for pods that do not exist
(200 with an Error, never 5xx).

- ``test_every_operation``: schemathesis' examples, coverage (boundary values) and fuzzing
  phases for each operation, positive and negative data, as a caller allowed everything.
- ``test_every_operation_refused`` (static tokens): the fuzzing phase again with a
  reader's token (403 on writes), an unknown token, a malformed header and none (401):
  the refusals conform too, and no input gets past the guard without a credential.
- ``test_stateful``: schemathesis' state machine over the document's links (a holding ->
  its release and its node; a node -> its holdings, events, deletion), the ones it infers,
  and ``BODY_LINKS`` (a node -> an admission, a filter and a bind on it); every scenario
  starts from one large node holding one holding, the answers that made them feeding
  their links.

Checks: not_a_server_error, status_code_conformance, content_type_conformance,
response_schema_conformance. Reproducible: derandomized Hypothesis, a fixed seed, no
example database. The request counts are printed at the end of each target.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis import Case, Response
from schemathesis.generation.stateful.state_machine import StepOutput
from schemathesis.specs.openapi.schemas import OpenApiSchema

from app.api.links import operation_ref
from tests.auth.fakes import write_tokens
from tests.support.databases import postgres_database, sqlite_database
from tests.support.kube_cluster import KubeCluster
from tests.support.service import running_service

pytestmark = [pytest.mark.kube, pytest.mark.slow]
ApiCase = Case[Any]
SEED = 20261123
MAX_EXAMPLES = 25  # per operation and phase
REFUSED_EXAMPLES = 10  # per operation, for the callers other than the admin
SCENARIOS, STEPS = 20, 10  # stateful: scenarios, and steps at most in each
PHASES = ("examples", "coverage", "fuzzing", "stateful")
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
)
# Their Pod and Node objects would make the coverage phase send ~280 variants each of
# fields the service passes through untouched; tests/kube/test_extender_wire.py fuzzes
# those bodies. The examples and fuzzing phases still run.
NO_COVERAGE = r"^/v1/extender/(filter|prioritize)$"

ADMIN = "fuzz-admin-token-5d1c8e7f2a9b"
READER = "fuzz-reader-token-0e6b3a8c4f17"
TOKENS = [
    {"user": "fuzz-admin", "token": ADMIN, "allow": ["*"]},
    {
        "user": "fuzz-reader",
        "token": READER,
        "allow": ["get nodes", "list nodes", "list holdings", "list events"],
    },
]
CREDENTIALS = {
    "admin": {"Authorization": f"Bearer {ADMIN}"},
    "reader": {"Authorization": f"Bearer {READER}"},
    "unknown": {"Authorization": "Bearer fuzz-unknown-token-77aa01"},
    "malformed": {"Authorization": f"Basic {ADMIN}"},
    "missing": {},
}
OPEN = {"/healthz", "/readyz"}  # never guarded

# Every stateful scenario starts from this node alone, big enough for any request the
# schema allows, with this holding on it: the answers that created them feed its links.
SEED_NAME = "fuzz-seed"
SEED_NODE: dict[str, Any] = {"capacity": {"cpu": 10**6, "memory": "1Ei", "gpu": 10**6}}
SEED_HOLDING: dict[str, Any] = {
    "node": SEED_NAME,
    "holder": {"kind": "manual", "id": "fuzz-seed-holding"},
    "requests": {"cpu": "1", "memory": "1Gi"},
}


# Links from a node (PUT's answer) to the calls that take its name in their body. OpenAPI's
# requestBody of a link is the whole body; schemathesis merges a partial one into the body
# it generates, which is what these need, so they live here and not in the served
# document. The node's name is the holder's id too: valid for either kind, one holder per
# node, so a repeat tests idempotency.
_NAME = "$response.body#/name"
BODY_LINKS = {
    "AdmitOnNode": {
        "operationRef": operation_ref("POST", "/v1/admissions"),
        "requestBody": {"node": _NAME, "holder": {"uid": _NAME, "id": _NAME}},
    },
    "FilterOnNode": {
        "operationRef": operation_ref("POST", "/v1/extender/filter"),
        "requestBody": {"NodeNames": [_NAME]},
    },
    "BindOnNode": {
        "operationRef": operation_ref("POST", "/v1/extender/bind"),
        "requestBody": {"Node": _NAME},
    },
}


@dataclass(frozen=True)
class Target:
    auth: str  # none | static
    database: str  # sqlite | postgresql

    def __str__(self) -> str:
        return f"auth-{self.auth}-{self.database}"


NONE = pytest.param(Target("none", "sqlite"), id="auth-none-sqlite")
STATIC = pytest.param(
    Target("static", "postgresql"), id="auth-static-postgresql", marks=pytest.mark.postgres
)


@dataclass
class Fuzzed:
    """The service under test, and what the fuzzer got from it."""

    target: Target
    url: str
    answers: Counter[tuple[str, str, int]] = field(default_factory=Counter)

    def headers(self, credential: str) -> dict[str, str]:
        return CREDENTIALS[credential] if self.target.auth == "static" else {}

    def record(self, phase: str, case: ApiCase, response: Response) -> None:
        self.answers[(phase, case.operation.label, response.status_code)] += 1

    def statuses(self, phase: str, label: str) -> set[int]:
        return {s for (p, op, s) in self.answers if (p, op) == (phase, label)}

    def empty_ledger(self) -> None:
        """Release every holding, delete every node."""
        with httpx.Client(base_url=self.url, headers=self.headers("admin"), timeout=10) as api:
            for holding in api.get("/v1/holdings").raise_for_status().json():
                holder = holding["holder"]
                params = {"kind": holder["kind"]}
                api.delete(f"/v1/admissions/{holder['id']}", params=params).raise_for_status()
            for node in api.get("/v1/nodes").raise_for_status().json():
                api.delete(f"/v1/nodes/{node['name']}").raise_for_status()

    def summary(self) -> str:
        by_phase, by_status = Counter[str](), Counter[int]()
        for (phase, _, status), count in self.answers.items():
            by_phase[phase] += count
            by_status[status] += count
        phases = ", ".join(f"{p} {n}" for p, n in sorted(by_phase.items()))
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(by_status.items()))
        return f"{by_phase.total()} requests ({phases}); statuses {statuses}"


@pytest.fixture(scope="module", params=[NONE, STATIC])
def fuzzed(
    request: pytest.FixtureRequest,
    kube_cluster: KubeCluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fuzzed]:
    target: Target = request.param
    tmp = tmp_path_factory.mktemp(f"fuzz-{target.auth}")
    env = {
        "NODELEDGER_KUBE_ENABLED": "true",
        "NODELEDGER_KUBE_KUBECONFIG": str(kube_cluster.kubeconfig),
        "NODELEDGER_KUBE_LEADER_ELECTION": "false",
        # A label no Node carries: no ledger node or GenericNode comes from Kubernetes.
        "NODELEDGER_KUBE_NODE_SELECTOR": f"nodeledger.io/fuzz-{uuid.uuid4().hex[:8]}=none",
        "NODELEDGER_AUTH_MODE": target.auth,
    }
    if target.auth == "static":
        env["NODELEDGER_AUTH_TOKEN_FILE"] = str(write_tokens(tmp / "tokens.json", TOKENS))
        env["NODELEDGER_AUTH_PROTECT_READS"] = "true"
    with (
        _database(request, target, tmp) as url,
        running_service(url, tmp, env=env, name=f"fuzz-{target.auth}", ready_timeout=60) as svc,
    ):
        fuzzed = Fuzzed(target, svc.url)
        yield fuzzed
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"\nschemathesis [{target}]: {fuzzed.summary()}")


@pytest.fixture
def api_schema(fuzzed: Fuzzed, request: pytest.FixtureRequest) -> OpenApiSchema:
    """The document the running service serves, with BODY_LINKS: every phase."""
    return _load(fuzzed, request, max_examples=MAX_EXAMPLES)


@pytest.fixture
def refused_schema(fuzzed: Fuzzed, request: pytest.FixtureRequest) -> OpenApiSchema:
    """The same, fuzzing only: schemathesis runs its examples and coverage phases only in
    tests without strategies of their own (the credential)."""
    return _load(fuzzed, request, max_examples=REFUSED_EXAMPLES, phases=("fuzzing",))


schema = schemathesis.pytest.from_fixture("api_schema")
refused = schemathesis.pytest.from_fixture("refused_schema")


@schema.parametrize()
def test_every_operation(case: ApiCase, fuzzed: Fuzzed) -> None:
    headers = fuzzed.headers("admin")
    response = case.call(headers=headers)
    fuzzed.record("operations", case, response)
    case.validate_response(response, headers=headers)


@pytest.mark.parametrize("fuzzed", [STATIC], indirect=True)
@refused.parametrize()
@refused.given(credential=st.sampled_from(sorted(set(CREDENTIALS) - {"admin"})))
def test_every_operation_refused(case: ApiCase, credential: str, fuzzed: Fuzzed) -> None:
    headers = fuzzed.headers(credential)
    response = case.call(headers=headers)
    fuzzed.record("refused", case, response)
    case.validate_response(response, headers=headers)
    if credential != "reader" and case.operation.path not in OPEN:
        # FastAPI parses the body before it runs the guard: only one that is not JSON at
        # all (422 json_invalid, nothing read from it) is answered before the 401.
        assert response.status_code == 401 or _not_json(response), response.text


def test_stateful(api_schema: OpenApiSchema, fuzzed: Fuzzed) -> None:
    headers = fuzzed.headers("admin")
    register = api_schema["/v1/nodes/{name}"]["PUT"].Case(
        path_parameters={"name": SEED_NAME}, body=SEED_NODE
    )
    admit = api_schema["/v1/admissions"]["POST"].Case(body=SEED_HOLDING)

    class Machine(api_schema.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            # Every scenario starts from the same ledger, so answers depend on the scenario
            # only (Hypothesis replays and shrinks them), and with the answers that made it,
            # so the links of a node and of a holding can be followed from the first step.
            fuzzed.empty_ledger()
            for case in (register, admit):
                response = case.call(headers=headers)
                assert response.status_code == 201, response.text
                self.recorder.record_case(case=case)
                self.recorder.record_response(case_id=case.id, response=response)
                # What schemathesis' own step does with an answer (< 5: a private method).
                self._add_results_to_targets((), [StepOutput(response, case)])

        def get_call_kwargs(self, case: ApiCase) -> dict[str, Any]:
            return {"headers": headers}

        def after_call(self, response: Response, case: ApiCase) -> None:
            super().after_call(response, case)
            fuzzed.record("stateful", case, response)

    Machine.run(
        settings=settings(
            max_examples=SCENARIOS,
            stateful_step_count=STEPS,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
    )
    # The links were followed: holdings admitted and released, the node looked at and
    # refused deletion while held, the extender asked about it.
    for label, wanted in (
        ("POST /v1/admissions", {200, 201}),
        ("DELETE /v1/admissions/{holder_uid}", {200}),
        ("GET /v1/nodes/{name}", {200}),
        ("DELETE /v1/nodes/{name}", {204, 409}),
        ("POST /v1/extender/filter", {200}),
        ("POST /v1/extender/bind", {200}),
    ):
        assert wanted & fuzzed.statuses("stateful", label), (label, fuzzed.summary())


@contextmanager
def _database(request: pytest.FixtureRequest, target: Target, tmp: Path) -> Iterator[str]:
    if target.database == "sqlite":
        yield sqlite_database(tmp)
    else:
        with postgres_database(request.getfixturevalue("postgres_server")) as url:
            yield url


def _load(
    fuzzed: Fuzzed,
    request: pytest.FixtureRequest,
    *,
    max_examples: int,
    phases: tuple[str, ...] = PHASES,
) -> OpenApiSchema:
    # schemathesis 4.32's from_fixture reads Node._nodeid, which pytest 9.2 renamed.
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid
    document: dict[str, Any] = httpx.get(f"{fuzzed.url}/openapi.json", timeout=10).json()
    for status in ("200", "201"):
        put = document["paths"]["/v1/nodes/{name}"]["put"]["responses"][status]
        put["links"].update(BODY_LINKS)
    config = schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "base-url": fuzzed.url,
            "request-timeout": 30,
            "generation": {
                "mode": "all",
                "max-examples": max_examples,
                "deterministic": True,
                "database": "none",
            },
            "phases": {
                **{phase: {"enabled": phase in phases} for phase in PHASES},
                "stateful": {"enabled": "stateful" in phases, "max-steps": STEPS},
            },
            "checks": {"enabled": False, **{name: {"enabled": True} for name in CHECKS}},
            "operations": [
                {"include-path-regex": NO_COVERAGE, "phases": {"coverage": {"enabled": False}}}
            ],
        }
    )
    return schemathesis.openapi.from_dict(document, config=config)


def _not_json(response: Response) -> bool:
    if response.status_code != 422:
        return False
    return all(error["type"] == "json_invalid" for error in response.json()["detail"])
