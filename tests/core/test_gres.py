"""GRES strings as slurmrestd shows them and as node updates send them (pure)."""

from __future__ import annotations

import pytest

from app.core.gres import (
    GresEntry,
    gres_count,
    gres_indices,
    parse_entry,
    split_items,
    with_counts,
)


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
        ("gpu:g3:1(IDX:3)", GresEntry("gpu", "g3", 1)),
        ("gpu:g0:0(IDX:N/A)", GresEntry("gpu", "g0", 0)),
        ("gpu:g1:0(IDX:)", GresEntry("gpu", "g1", 0)),
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


# One GRES type per device (issue 23), as the test clusters' n3 shows it (24.11.5, 26.05.3).
TYPED = "k8scpu:16,k8smemory:32000,k8sgpu:4,gpu:g0:1,gpu:g1:1,gpu:g2:1,gpu:g3:1"
TYPED_USED = (
    "k8scpu:2,k8smemory:100,k8sgpu:1,"
    "gpu:g0:0(IDX:N/A),gpu:g1:0(IDX:N/A),gpu:g2:0(IDX:N/A),gpu:g3:1(IDX:3)"
)


@pytest.mark.parametrize(
    ("text", "gpus"),
    [(TYPED, 4), (TYPED_USED, 1), ("gpu:g0:1,gpu:g1:1", 2), ("gpu:g0:0(IDX:N/A)", 0)],
    ids=str,
)
def test_count_of_one_type_per_device(text: str, gpus: int) -> None:
    assert gres_count(text, "gpu") == gpus


def test_with_counts_keeps_one_type_per_device() -> None:
    assert with_counts(TYPED, {"k8sgpu": 3}) == (
        "k8scpu:16,k8smemory:32000,gpu:g0:1,gpu:g1:1,gpu:g2:1,gpu:g3:1,k8sgpu:3"
    )


@pytest.mark.parametrize(
    ("detail", "indices"),
    [
        ("gpu:g1:1(IDX:1),gpu:g2:1(IDX:2),k8scpu(CNT:2),k8smemory(CNT:100),k8sgpu(CNT:2)", (1, 2)),
        ("gpu:g0:1(IDX:0),gpu:g1:0(IDX:),gpu:g2:0(IDX:),gpu:g3:0(IDX:),k8sgpu(CNT:1)", (0,)),
        ("gpu:3(IDX:0-1,3),k8scpu(CNT:2)", (0, 1, 3)),
        ("gpu:g0:0(IDX:N/A)", ()),
        ("k8scpu(CNT:2),k8smemory(CNT:100)", ()),
        ("", ()),
    ],
    ids=str,
)
def test_gres_indices_names_the_devices_a_job_holds(detail: str, indices: tuple[int, ...]) -> None:
    assert gres_indices(detail, "gpu") == indices


def test_with_counts_replaces_ours_and_keeps_others_unscaled() -> None:
    shown = "k8scpu:16,k8smemory:64K,gpu:tesla:4(S:0-1),license_x:2"
    assert (
        with_counts(shown, {"k8scpu": 12, "k8smemory": 60000})
        == "gpu:tesla:4,license_x:2,k8scpu:12,k8smemory:60000"
    )


def test_with_counts_adds_missing_entries() -> None:
    # Slurm drops zero counts from the string; pushing them back must re-add them.
    assert with_counts("gpu:4", {"k8scpu": 0, "k8sgpu": 4}) == "gpu:4,k8scpu:0,k8sgpu:4"
