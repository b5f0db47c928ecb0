"""GRES strings as slurmrestd shows them and as node updates send them (pure)."""

from __future__ import annotations

import pytest

from app.core.gres import GresEntry, gres_count, parse_entry, split_items, with_counts


@pytest.mark.parametrize(
    ("item", "entry"),
    [
        ("k8scpu:16", GresEntry("k8scpu", None, 16)),
        ("k8smemory:64K", GresEntry("k8smemory", None, 65536)),
        ("k8smemory:2M", GresEntry("k8smemory", None, 2 * 1024**2)),
        ("gpu:tesla:4(S:0-1)", GresEntry("gpu", "tesla", 4)),
        ("gpu:2(IDX:0-1)", GresEntry("gpu", None, 2)),
        ("k8scpu(CNT:4)", GresEntry("k8scpu", None, 4)),
        ("gpu", GresEntry("gpu", None, 1)),
        ("gpu:a100", GresEntry("gpu", "a100", 1)),
    ],
    ids=str,
)
def test_parse_entry(item: str, entry: GresEntry) -> None:
    assert parse_entry(item) == entry


def test_split_ignores_commas_inside_parentheses() -> None:
    assert split_items("gpu:2(IDX:0,2),k8scpu(CNT:4),(null)") == ["gpu:2(IDX:0,2)", "k8scpu(CNT:4)"]
    assert split_items("") == []


def test_count_sums_types_and_is_zero_when_absent() -> None:
    assert gres_count("gpu:a:2(S:0),gpu:b:1,k8scpu:3", "gpu") == 3
    assert gres_count("k8scpu:3", "k8sgpu") == 0


def test_with_counts_replaces_ours_and_keeps_others_unscaled() -> None:
    shown = "k8scpu:16,k8smemory:64K,gpu:tesla:4(S:0-1),license_x:2"
    assert (
        with_counts(shown, {"k8scpu": 12, "k8smemory": 60000})
        == "gpu:tesla:4,license_x:2,k8scpu:12,k8smemory:60000"
    )


def test_with_counts_adds_missing_entries() -> None:
    # Slurm drops zero counts from the string; pushing them back must re-add them.
    assert with_counts("gpu:4", {"k8scpu": 0, "k8sgpu": 4}) == "gpu:4,k8scpu:0,k8sgpu:4"
