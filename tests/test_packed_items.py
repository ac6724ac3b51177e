"""A big stream's items held packed read back as the items themselves, in order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calor.server.commands import NewMemory, PackedItems


def items(count: int, start: int = 0) -> list[NewMemory]:
    return [
        NewMemory(channel=f"c{i % 3}", text=f"note {i}", tags={"n": str(i)}).read()
        for i in range(start, start + count)
    ]


@given(st.lists(st.integers(min_value=0, max_value=7), max_size=6))
def test_packed_chunks_read_back_as_the_items_in_order(sizes: list[int]) -> None:
    packed, whole = PackedItems(), []
    for size in sizes:
        chunk = items(size, len(whole))
        packed.add(PackedItems.pack(chunk), len(chunk))
        whole.extend(chunk)
    assert len(packed) == len(whole)
    assert list(packed) == whole
    assert [packed[i] for i in range(len(whole))] == whole
    assert [packed[-i] for i in range(1, len(whole) + 1)] == [
        whole[-i] for i in range(1, len(whole) + 1)
    ]
    assert packed[1:-1:2] == whole[1:-1:2]
    with pytest.raises(IndexError):
        packed[len(whole)]
    with pytest.raises(IndexError):
        packed[-len(whole) - 1]


def test_the_reading_of_a_packed_item_is_kept() -> None:
    packed = PackedItems()
    chunk = items(3)
    packed.add(PackedItems.pack(chunk), 3)
    assert packed[2].reading == chunk[2].reading is not None
