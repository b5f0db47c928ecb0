"""The documentation holds together: docs/configuration.md is what the settings models say,
every relative link in README.md and docs/*.md leads somewhere, and the README stays short."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 150

sys.path.insert(0, str(ROOT / "scripts"))
import gen_config_docs  # noqa: E402

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def _prose(text: str) -> list[str]:
    """The page's lines outside fenced code blocks."""
    lines, in_fence = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            in_fence = not in_fence
            continue
        if not in_fence:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces
    to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in _prose(path.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    text = "\n".join(_prose(path.read_text()))
    text = re.sub(r"`[^`\n]*`", "", text)  # links written as code are examples
    return LINK.findall(text)


def test_configuration_page_is_generated_from_the_settings() -> None:
    page = ROOT / "docs" / "configuration.md"
    assert page.read_text() == gen_config_docs.render(), (
        "docs/configuration.md is out of date with app/**/settings.py; regenerate it: "
        "PYTHONPATH=. python scripts/gen_config_docs.py"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_files_and_headings(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT)}")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: broken links:\n" + "\n".join(broken)


def test_readme_stays_short() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move details to docs/"
    )


def test_slug_is_githubs() -> None:
    assert slug("Job hints from slurmctld") == "job-hints-from-slurmctld"
    assert slug("Kubernetes at scale (bench/kube_scale.py)") == (
        "kubernetes-at-scale-benchkube_scalepy"
    )
    assert slug("Limits on what a caller can cost") == "limits-on-what-a-caller-can-cost"
    assert slug("Crash test: kill -9 of replicas") == "crash-test-kill--9-of-replicas"


CODE_POINTER = re.compile(r"docs/([\w-]+\.md)(?:#([\w-]+))?")
# A heading named in words after the page ('docs/x.md "Heading"', 'docs/x.md, Heading'):
# nothing checks the words, so pointers name headings by their anchor instead.
WORDED_HEADING = re.compile(r"docs/[\w-]+\.md(?:,\s*|\s*\(?)\"?[A-Z]")


def test_pointers_from_the_code_lead_to_docs_pages_and_headings() -> None:
    """Docstrings and messages point into docs/ (the README is only the quick start): every
    such pointer names a page, and a heading of it, that exist."""
    broken = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        where = path.relative_to(ROOT)
        text = path.read_text()
        if "README" in text:
            broken.append(f"{where}: points at the README; its sections moved to docs/")
        for worded in WORDED_HEADING.findall(text):
            broken.append(f"{where}: {worded!r}...: name the heading as docs/page.md#anchor")
        for page, anchor in CODE_POINTER.findall(text):
            dest = ROOT / "docs" / page
            if not dest.exists():
                broken.append(f"{where}: no page docs/{page}")
            elif anchor and anchor not in anchors(dest):
                broken.append(f"{where}: no heading #{anchor} in docs/{page}")
    assert not broken, "\n".join(broken)
