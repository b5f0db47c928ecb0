"""The web page in a real headless Chromium (Debian's, driven by Playwright, which never
downloads a browser here) against a real `nodeledger serve` on SQLite: the nodes with their
bars and numbers, an admission made through the REST API showing up without a reload,
filter, sort and paging, and protected reads shown as a message. The screenshot of the
first test is kept under $NODELEDGER_ARTIFACTS (default /tmp/nodeledger/artifacts)/web."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import (
    Browser,
    ConsoleMessage,
    Locator,
    Page,
    Playwright,
    expect,
    sync_playwright,
)
from playwright.sync_api import Error as PlaywrightError

from app.core.records import HolderKind
from app.core.resources import Resources
from app.db.engine import Database
from app.ledger.service import Ledger, SnapshotEntry
from tests.support.headroom import set_headroom
from tests.support.realenv import unavailable
from tests.support.service import ServiceProcess, running_service

GIB = 2**30
TOKEN = "web-page-test-token-0123456789"
LIVE_TIMEOUT_MS = 20_000  # the page polls every 2 s; a loaded machine renders slowly


def artifacts() -> Path:
    directory = Path(os.environ.get("NODELEDGER_ARTIFACTS", "/tmp/nodeledger/artifacts")) / "web"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def chromium_executable() -> str:
    """NODELEDGER_CHROMIUM, else Debian's chromium on the PATH."""
    path = os.environ.get("NODELEDGER_CHROMIUM") or shutil.which("chromium")
    if not path or not os.access(path, os.X_OK):
        unavailable(
            "Chromium",
            "install Debian's chromium (scripts/install-system-deps.sh) or set NODELEDGER_CHROMIUM",
        )
    return path


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    executable = chromium_executable()
    try:
        browser = playwright.chromium.launch(executable_path=executable, headless=True)
    except PlaywrightError as exc:
        unavailable("Chromium", f"{executable} does not start: {exc.message[:500]}")
    yield browser
    browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh tab; any script error or failed request the page logs fails the test."""
    context = browser.new_context(viewport={"width": 1440, "height": 900}, locale="en-GB")
    tab = context.new_page()
    problems: list[str] = []
    tab.on("pageerror", lambda error: problems.append(f"page error: {error}"))

    def console(message: ConsoleMessage) -> None:
        # Chromium logs every non-2xx fetch; the 401 test expects those.
        if message.type == "error" and "401 (Unauthorized)" not in message.text:
            problems.append(f"console: {message.text}")

    tab.on("console", console)
    yield tab
    context.close()
    assert problems == []


@pytest.fixture
def service(sqlite_url: str, tmp_path: Path) -> Iterator[ServiceProcess]:
    with running_service(sqlite_url, tmp_path) as running:
        yield running


def put_node(api: httpx.Client, name: str, cpu: str, memory: str, **extra: Any) -> None:
    body = {"capacity": {"cpu": cpu, "memory": memory, "gpu": extra.pop("gpu", 0)}, **extra}
    answer = api.put(f"/v1/nodes/{name}", json=body)
    assert answer.status_code == 201, answer.text


def row_names(page: Page) -> list[str]:
    rows = page.locator("#nodes tbody tr")
    names: list[str] = rows.evaluate_all("rows => rows.map(r => r.dataset.node)")
    return names


def bar(page: Page, node: str, resource: str) -> Locator:
    return page.locator(f'#nodes tr[data-node="{node}"] [role="img"][data-resource="{resource}"]')


def test_page_draws_the_nodes_and_shows_an_admission_live(
    service: ServiceProcess, page: Page, sqlite_url: str
) -> None:
    api = httpx.Client(base_url=service.url, timeout=10)
    reserved = {"cpu": "500m", "memory": "2Gi"}
    put_node(api, "n1", "16", "64Gi", gpu=4, reserved=reserved, slurm_name="node001")
    put_node(api, "n2", "8", "32Gi", reserved=reserved)
    put_node(api, "n3", "32", "128Gi", gpu=2, cordon_reason="maintenance until 14:00")
    manual = {"kind": "manual", "id": "ops-hold"}
    held = api.post(
        "/v1/admissions", json={"node": "n2", "holder": manual, "requests": {"cpu": "2"}}
    )
    assert held.status_code == 201, held.text
    # What the Slurm sync would record for a running job (the same database file).
    database = Database.from_url(sqlite_url)
    try:
        job = SnapshotEntry("job 4711 (alice)", Resources(4000, 8 * GIB, 1))
        ledger = Ledger(database)
        ledger.replace_holdings("n1", HolderKind.SLURM_JOB, {"4711": job})
        # n1 has a Kubernetes headroom of 2 CPUs and 4Gi, all of it granted by Slurm.
        headroom = Resources(2000, 4 * GIB)
        set_headroom(ledger, "n1", target=headroom, granted=headroom)
    finally:
        database.dispose()

    page.goto(f"{service.url}/")
    expect(page).to_have_title("nodeledger")
    expect(page.locator("#nodes tbody tr")).to_have_count(3)
    assert row_names(page) == ["n1", "n2", "n3"]
    cpu = bar(page, "n1", "cpu")
    expect(cpu).to_have_attribute(
        "aria-label",
        "CPU on n1: capacity 16; Kubernetes 0, Slurm 4, manual 0, reserved 500m, free 11500m",
    )
    expect(cpu.locator(".segment.slurm")).to_have_count(1)
    expect(cpu.locator(".segment.kubernetes")).to_have_count(0)
    expect(page.locator('tr[data-node="n1"] td.cpu .numbers')).to_contain_text("free 11500m of 16")
    expect(page.locator('tr[data-node="n1"] th')).to_contain_text("Slurm: node001")
    expect(bar(page, "n1", "memory")).to_have_attribute(
        "aria-label",
        "Memory on n1: capacity 64Gi; Kubernetes 0, Slurm 8Gi, manual 0, reserved 2Gi, free 54Gi",
    )
    expect(bar(page, "n2", "gpu")).to_have_attribute("aria-label", "GPUs on n2: none")
    expect(bar(page, "n2", "cpu").locator(".segment.manual")).to_have_count(1)
    expect(page.locator('tr[data-node="n3"] td.admissible')).to_have_text(
        "nomaintenance until 14:00"
    )
    expect(page.locator('tr[data-node="n1"] td.admissible')).to_have_text("yes")
    n1_headroom = page.locator('tr[data-node="n1"] td.headroom')
    expect(n1_headroom).to_have_attribute(
        "title", "Headroom on n1: CPU target 2, free 2; Memory target 4Gi, free 4Gi"
    )
    expect(n1_headroom.locator('[data-resource="cpu"]')).to_have_text("CPU 2 / 2")
    expect(page.locator('tr[data-node="n2"] td.headroom')).to_have_text("none")
    expect(page.locator("#events")).to_contain_text("node created")
    page.evaluate("window.notReloaded = true")

    # 1. An admission through the REST API; the page shows it at its next poll.
    started = time.monotonic()
    pod = {"kind": "pod", "namespace": "ml", "name": "trainer-0", "uid": "7d0c1f2e"}
    requests = {"cpu": "1500m", "memory": "6Gi", "gpu": 1}
    admitted = api.post("/v1/admissions", json={"node": "n1", "holder": pod, "requests": requests})
    assert admitted.status_code == 201, admitted.text
    expect(cpu).to_have_attribute(
        "aria-label",
        "CPU on n1: capacity 16; Kubernetes 1500m, Slurm 4, manual 0, reserved 500m, free 10",
        timeout=LIVE_TIMEOUT_MS,
    )
    shown_after = time.monotonic() - started
    expect(cpu.locator(".segment.kubernetes")).to_have_count(1)
    expect(page.locator('tr[data-node="n1"] td.cpu .numbers')).to_contain_text("K8s 1500m")
    # The pod holds 1500m and 6Gi of the headroom's grant: 500m and no memory left.
    expect(n1_headroom.locator('[data-resource="cpu"]')).to_have_text("CPU 2 / 500m")
    expect(n1_headroom.locator('[data-resource="memory"]')).to_have_text("Memory 4Gi / 0")
    expect(bar(page, "n1", "gpu")).to_have_attribute(
        "aria-label", "GPUs on n1: capacity 4; Kubernetes 1, Slurm 1, manual 0, reserved 0, free 2"
    )
    admitted_event = page.locator("#events li.admitted", has_text="ml/trainer-0")
    expect(admitted_event).to_contain_text("n1", timeout=LIVE_TIMEOUT_MS)
    assert page.evaluate("window.notReloaded") is True
    expect(page.locator("#problem")).to_be_hidden()
    expect(page.locator("#auth")).to_be_hidden()

    screenshot = artifacts() / "page.png"
    page.screenshot(path=str(screenshot), full_page=True)
    (artifacts() / "page.json").write_text(json.dumps({"shown_after_s": round(shown_after, 2)}))
    assert shown_after < LIVE_TIMEOUT_MS / 1000

    # 2. Which holder has which GPU device (issue 23): only holdings that name theirs.
    devices = page.locator('tr[data-node="n1"] th .gpu-devices')
    expect(devices).to_have_count(0)
    gpu_pod = {"kind": "pod", "namespace": "ml", "name": "trainer-1", "uid": "9e1a"}
    one_gpu = {"cpu": "500m", "memory": "1Gi", "gpu": 1}
    uuid = "GPU-5ad9f3ab-1c4f-4e52-9b1e-0f3c1b2d4e6a"
    body = {
        "node": "n1",
        "holder": gpu_pod,
        "requests": one_gpu,
        "devices": [{"index": 3, "uuid": uuid}],
    }
    assert api.post("/v1/admissions", json=body).status_code == 201
    expect(devices).to_have_text("GPU 3: ml/trainer-1", timeout=LIVE_TIMEOUT_MS)
    expect(devices).to_have_attribute("title", f"GPU device 3 ({uuid}) on n1: pod ml/trainer-1")
    expect(page.locator('tr[data-node="n2"] th .gpu-devices')).to_have_count(0)


def test_filter_sort_and_paging(service: ServiceProcess, page: Page) -> None:
    api = httpx.Client(base_url=service.url, timeout=10)
    names = [f"n{i:02}" for i in range(12)]
    for i, name in enumerate(names):
        put_node(api, name, str(4 + (i * 5) % 12), "16Gi")  # free CPU not in name order

    page.goto(f"{service.url}/?limit=5")
    expect(page.locator("#nodes tbody tr")).to_have_count(5)
    assert row_names(page) == names[:5]
    expect(page.locator("#prev")).to_be_disabled()
    page.get_by_role("button", name="Next").click()
    expect(page.locator("#page-info")).to_have_text("Page 2")
    expect(page.locator("#nodes tbody tr").first).to_have_attribute("data-node", "n05")
    assert row_names(page) == names[5:10]
    page.get_by_role("button", name="Next").click()
    expect(page.locator("#nodes tbody tr")).to_have_count(2)
    assert row_names(page) == names[10:]
    expect(page.locator("#next")).to_be_disabled()
    page.get_by_role("button", name="Previous").click()
    expect(page.locator("#nodes tbody tr").first).to_have_attribute("data-node", "n05")
    assert row_names(page) == names[5:10]

    # A node added on the page being shown appears at the next poll.
    put_node(api, "n05a", "4", "16Gi")
    expect(page.locator('#nodes tr[data-node="n05a"]')).to_have_count(1, timeout=LIVE_TIMEOUT_MS)
    assert row_names(page) == ["n05", "n05a", "n06", "n07", "n08"]

    page.get_by_label("Filter by name").fill("n1")
    expect(page.locator("#nodes tbody tr")).to_have_count(2)
    assert row_names(page) == ["n10", "n11"]
    expect(page.locator("#page-info")).to_have_text("Page 1")
    assert "q=n1" in page.url

    page.get_by_label("Filter by name").fill("")
    page.get_by_label("Sort by").select_option("free_cpu")
    expect(page.locator("#nodes tbody tr").first).to_have_attribute("data-node", "n07")
    by_free = row_names(page)
    cpu_of = {n["name"]: n["free"]["cpu_millis"] for n in api.get("/v1/nodes").json()}
    assert by_free == sorted(cpu_of, key=lambda n: (-cpu_of[n], n))[:5]
    page.get_by_role("button", name="Next").click()
    expect(page.locator("#page-info")).to_have_text("Page 2")
    assert set(row_names(page)).isdisjoint(by_free)
    assert "sort=free_cpu" in page.url


@pytest.fixture
def protected_service(sqlite_url: str, tmp_path: Path) -> Iterator[ServiceProcess]:
    """A service whose reads need a token. A fixture (asked for before ``page``) so that
    the tab closes before the service stops: a poll in between would log a refused
    connection and fail the test."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps([{"user": "ops", "token": TOKEN, "allow": ["*"]}]))
    env = {
        "NODELEDGER_AUTH_MODE": "static",
        "NODELEDGER_AUTH_TOKEN_FILE": str(tokens),
        "NODELEDGER_AUTH_PROTECT_READS": "true",
    }
    with running_service(sqlite_url, tmp_path, env=env) as running:
        yield running


def test_protected_reads_show_a_message_until_a_token_is_given(
    protected_service: ServiceProcess, page: Page
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    api = httpx.Client(base_url=protected_service.url, timeout=10, headers=headers)
    put_node(api, "n1", "8", "16Gi")

    page.goto(f"{protected_service.url}/")
    problem = page.get_by_role("alert")
    expect(problem).to_contain_text("HTTP 401")
    expect(problem).to_contain_text("NODELEDGER_AUTH_PROTECT_READS")
    expect(page.locator("#nodes tbody tr")).to_have_count(0)
    expect(page.locator("#status")).to_have_text("Not updated")
    expect(page.get_by_label("Bearer token")).to_be_visible()
    page.screenshot(path=str(artifacts() / "unauthorized.png"))

    page.get_by_label("Bearer token").fill(TOKEN)
    page.get_by_role("button", name="Use token").click()
    expect(page.locator('#nodes tr[data-node="n1"]')).to_have_count(1)
    expect(problem).to_be_hidden()
    expect(page.get_by_label("Bearer token")).to_be_hidden()
    expect(page.locator("#events")).to_contain_text("node created")
