"""Kubernetes quantities to base units: table-driven, with the rounding direction."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.core import quantities as q
from app.core.presentation import format_cpu, format_memory
from app.core.quantities import QuantityError, Rounding, cpu_millis, gpu_count, memory_bytes

CPU = [
    ("250m", Rounding.UP, 250),
    ("2", Rounding.UP, 2000),
    ("1.5", Rounding.UP, 1500),
    (0.5, Rounding.UP, 500),
    (3, Rounding.UP, 3000),
    ("1e3", Rounding.UP, 1_000_000),
    ("100u", Rounding.UP, 1),  # 0.1 millicore held as 1: never less than asked
    ("100u", Rounding.DOWN, 0),  # a capacity never promises more than exists
    ("1500500u", Rounding.UP, 1501),
    ("0", Rounding.UP, 0),
    ("+2", Rounding.UP, 2000),
    (" 2 ", Rounding.UP, 2000),
    (".5", Rounding.UP, 500),
]


@pytest.mark.parametrize(("text", "rounding", "expected"), CPU, ids=[str(c[0]) for c in CPU])
def test_cpu_millis(text: str, rounding: Rounding, expected: int) -> None:
    assert cpu_millis(text, rounding) == expected


MEMORY = [
    ("4Gi", Rounding.UP, 4 * 2**30),
    ("2G", Rounding.UP, 2 * 10**9),
    ("1k", Rounding.UP, 1000),
    ("1Ki", Rounding.UP, 1024),
    ("128974848", Rounding.UP, 128974848),
    ("129e6", Rounding.UP, 129000000),
    ("123Mi", Rounding.UP, 123 * 2**20),
    ("1.5Ki", Rounding.UP, 1536),
    ("1500m", Rounding.UP, 2),
    ("1500m", Rounding.DOWN, 1),
    (1024, Rounding.UP, 1024),
]


@pytest.mark.parametrize(("text", "rounding", "expected"), MEMORY, ids=[str(m[0]) for m in MEMORY])
def test_memory_bytes(text: str, rounding: Rounding, expected: int) -> None:
    assert memory_bytes(text, rounding) == expected


BAD = [
    ("-1", "negative"),
    ("2Xi", "not a quantity"),
    ("1_000", "not a quantity"),
    ("NaN", "not a quantity"),
    ("Infinity", "not a quantity"),
    ("", "not a quantity"),
    ("1.2.3", "not a quantity"),
    ("ki", "not a quantity"),
    ("1ki", "not a quantity"),
    ("1e999999", "exceeds the maximum"),
    ("9E", "exceeds the maximum"),
    (float("inf"), "finite"),
    (True, "boolean"),
]


@pytest.mark.parametrize(("value", "message"), BAD, ids=[repr(b[0]) for b in BAD])
def test_bad_quantities_are_refused_with_a_reason(value: str, message: str) -> None:
    with pytest.raises(QuantityError, match=message):
        memory_bytes(value) if message != "exceeds the maximum" else cpu_millis(value)


def test_gpus_are_whole() -> None:
    assert gpu_count("2") == 2
    assert gpu_count(1) == 1
    with pytest.raises(QuantityError, match="whole number"):
        gpu_count("1.5")
    with pytest.raises(QuantityError, match="whole number"):
        gpu_count("500m")


FORMAT_CPU = [(0, "0"), (1000, "1"), (1500, "1500m"), (1735, "1735m"), (-250, "-250m")]
FORMAT_MEM = [
    (0, "0"),
    (1024, "1Ki"),
    (4 * 2**30, "4Gi"),
    (2393 * 2**20, "2393Mi"),
    (1000, "1000"),
    (-(2**20), "-1Mi"),
]


@pytest.mark.parametrize(("millis", "text"), FORMAT_CPU)
def test_format_cpu(millis: int, text: str) -> None:
    assert format_cpu(millis) == text


@pytest.mark.parametrize(("num", "text"), FORMAT_MEM)
def test_format_memory(num: int, text: str) -> None:
    assert format_memory(num) == text


@given(st.integers(min_value=0, max_value=10**9))
def test_cpu_format_parse_round_trip(millis: int) -> None:
    assert cpu_millis(format_cpu(millis)) == millis


@given(st.integers(min_value=0, max_value=2**60))
def test_memory_format_parse_round_trip(num: int) -> None:
    assert memory_bytes(format_memory(num)) == num


QUANTITIES = st.one_of(
    st.from_regex(r"\A[+ ]?[0-9]{0,4}\.?[0-9]{0,3}([eE][+-]?[0-9]|[KMGT]i|[numkMGT])?\Z"),
    st.integers(min_value=-5, max_value=2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=40),
)


def _outcome(convert: object, value: object) -> object:
    try:
        return convert(value)  # type: ignore[operator]
    except QuantityError as exc:
        return ("refused", str(exc))


@given(QUANTITIES, st.sampled_from(Rounding))
def test_remembered_parses_answer_as_fresh_ones(value: object, rounding: Rounding) -> None:
    """The cache of parses (app.core.quantities) answers a value as an uncached parse
    does, a second time as the first, errors included; a bool is still refused."""
    fresh = (
        _outcome(lambda v: q._cpu_millis(v, rounding), value),
        _outcome(lambda v: q._memory_bytes(v, rounding), value),
        _outcome(q._gpu_count, value),
    )
    for _ in range(2):
        assert (
            _outcome(lambda v: cpu_millis(v, rounding), value),
            _outcome(lambda v: memory_bytes(v, rounding), value),
            _outcome(gpu_count, value),
        ) == fresh


def test_only_short_plain_values_are_remembered() -> None:
    long = "0" * 100 + "1"
    assert cpu_millis(long) == 1000
    assert not q._cacheable(long)
    assert not q._cacheable(True)
    assert q._cacheable("250m")
    with pytest.raises(QuantityError, match="boolean"):
        cpu_millis(True)
