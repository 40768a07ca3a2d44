"""The checkpoint scan's bounds on bytes made by hand: a zip64 end record, nested pickles at the depth limit."""

from __future__ import annotations

import io
import pickle
import struct

import pytest

from service.errors import TooLarge
from service.introspection.checkpoint_scan import ZIP_EXTRA_FILES, CheckpointLimits, check_pickles, check_zip_entries


def zip64_end(count: int, record: bytes | None = None) -> bytes:
    """The end of a zip whose entry count only its zip64 record holds (the classic record says 0xFFFF)."""
    files = b"\0" * 10  # stands in for the files and the central directory: the check never reads them
    if record is None:
        record = b"PK\x06\x06" + struct.pack("<QHHIIQQQQ", 44, 45, 45, 0, 0, count, count, 0, 0)
    locator = b"PK\x06\x07" + struct.pack("<IQI", 0, len(files), 1)
    classic = b"PK\x05\x06" + struct.pack("<HHHHIIH", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return files + record + locator + classic


def test_a_zip64_archive_is_counted_by_its_zip64_record() -> None:
    check_zip_entries(io.BytesIO(zip64_end(200)), CheckpointLimits(entries=200 - ZIP_EXTRA_FILES))
    with pytest.raises(TooLarge, match="checkpoint holds 200 files"):
        check_zip_entries(io.BytesIO(zip64_end(200)), CheckpointLimits(entries=199 - ZIP_EXTRA_FILES))


def test_a_zip64_locator_to_something_else_is_left_to_the_zip_reader() -> None:
    """No zip64 signature where the locator points: no count is read from those bytes (the zip reader refuses)."""
    check_zip_entries(io.BytesIO(zip64_end(0, record=b"\xff" * 56)), CheckpointLimits(entries=10))


def nested(levels: int) -> list[object]:
    value: list[object] = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_lists_nested_exactly_to_the_depth_limit_pass() -> None:
    """Protocol 0 builds each list from an empty MARK ... LIST: the innermost empty list is one level."""
    data = pickle.dumps(nested(6), protocol=0)
    check_pickles(io.BytesIO(data), CheckpointLimits(depth=6))
    with pytest.raises(TooLarge, match="more than 5 levels deep"):
        check_pickles(io.BytesIO(data), CheckpointLimits(depth=5))


@pytest.mark.parametrize(
    ("data", "entries"),
    [
        (b"(I1\nI2\nI3\nI4\nI5\nI6\nd.", 3),  # protocol 0: MARK 1 2 3 4 5 6 DICT is {1: 2, 3: 4, 5: 6}
        (pickle.dumps(frozenset(range(3)), protocol=4), 3),  # MARK 0 1 2 FROZENSET
    ],
    ids=["DICT", "FROZENSET"],
)
def test_containers_built_from_a_mark_count_their_entries(data: bytes, entries: int) -> None:
    assert len(pickle.loads(data)) == entries
    check_pickles(io.BytesIO(data), CheckpointLimits(entries=entries))
    with pytest.raises(TooLarge, match=f"over the limit of {entries - 1} entries"):
        check_pickles(io.BytesIO(data), CheckpointLimits(entries=entries - 1))
