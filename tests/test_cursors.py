"""The one encoding of integer event-log positions as cursor tokens."""

from __future__ import annotations

import pytest
from taskmill import InvalidCursor, TaskmillError
from taskmill.cursors import POSITION_DIGITS, position_token, token_position


def test_position_tokens_sort_as_their_positions_and_read_back() -> None:
    positions = [0, 1, 9, 10, 99, 100, 12345, 2**63 - 1, 10**POSITION_DIGITS - 1]
    tokens = [position_token(p) for p in positions]
    assert sorted(tokens) == tokens
    assert [token_position(t) for t in tokens] == positions
    assert all(len(t) == POSITION_DIGITS and "." not in t for t in tokens)


@pytest.mark.parametrize("token", ["", "7", "-0000000000000000001", "1" * 21, "٣" * 20, "x" * 20])
def test_a_token_the_encoding_did_not_write_is_refused(token: str) -> None:
    with pytest.raises(InvalidCursor, match=r"TaskEvent\.cursor") as raised:
        token_position(token)
    assert isinstance(raised.value, TaskmillError)


@pytest.mark.parametrize("position", [-1, 10**POSITION_DIGITS])
def test_a_position_out_of_range_is_a_bug_of_the_store(position: int) -> None:
    with pytest.raises(ValueError, match="event-log position"):
        position_token(position)
