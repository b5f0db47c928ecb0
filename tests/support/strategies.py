"""Hypothesis strategies shared by the fuzz tests of the API."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


def json_values(*, text_size: int, width: int, leaves: int) -> st.SearchStrategy[Any]:
    """Any JSON value (finite numbers only: a client cannot send NaN or infinity)."""
    return st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=text_size),
        lambda inner: (
            st.lists(inner, max_size=width)
            | st.dictionaries(st.text(max_size=8), inner, max_size=width)
        ),
        max_leaves=leaves,
    )
