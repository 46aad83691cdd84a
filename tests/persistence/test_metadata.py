"""MetadataStore: atomic, framed files; damage raises an error that names the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from persistence import CorruptMetadataError, MetadataStore


def test_nothing_written_reads_as_none(tmp_path: Path) -> None:
    meta = MetadataStore(str(tmp_path / "meta"))
    assert meta.read_member_list() is None
    assert meta.read_partition_table() is None
    assert meta.read_cluster_state() is None


def test_each_kind_round_trips_and_is_replaced(tmp_path: Path) -> None:
    meta = MetadataStore(str(tmp_path / "meta"))
    members = [{"name": "member-0", "uuid": "a1", "endpoint": "tcp://127.0.0.1:5701"}]
    meta.write_member_list(members)
    meta.write_partition_table(b"\x00\x01table")
    meta.write_cluster_state("ACTIVE")
    again = MetadataStore(str(tmp_path / "meta"))
    assert again.read_member_list() == members
    assert again.read_partition_table() == b"\x00\x01table"
    assert again.read_cluster_state() == "ACTIVE"
    again.write_cluster_state("PASSIVE")
    again.write_partition_table(b"")
    assert meta.read_cluster_state() == "PASSIVE"
    assert meta.read_partition_table() == b""
    assert sorted(p.name for p in (tmp_path / "meta").iterdir()) == [
        "cluster_state.meta", "member_list.meta", "partition_table.meta"]


def test_a_leftover_temp_file_does_not_matter(tmp_path: Path) -> None:
    meta = MetadataStore(str(tmp_path / "meta"))
    meta.write_cluster_state("ACTIVE")
    (tmp_path / "meta" / "cluster_state.meta.tmp.12345").write_bytes(b"half")
    assert meta.read_cluster_state() == "ACTIVE"


@pytest.mark.parametrize("damage", ["truncate head", "truncate payload", "flip payload",
                                    "flip head", "bad magic", "append"])
def test_damaged_files_raise_naming_the_file(tmp_path: Path, damage: str) -> None:
    meta = MetadataStore(str(tmp_path / "meta"))
    meta.write_member_list([1, 2, 3])
    file = tmp_path / "meta" / "member_list.meta"
    data = bytearray(file.read_bytes())
    if damage == "truncate head":
        data = data[:10]
    elif damage == "truncate payload":
        data = data[:-1]
    elif damage == "flip payload":
        data[-2] ^= 1
    elif damage == "flip head":
        data[12] ^= 1
    elif damage == "bad magic":
        data[0:8] = b"NOTMETA!"
    else:
        data += b"x"
    file.write_bytes(bytes(data))
    with pytest.raises(CorruptMetadataError) as info:
        meta.read_member_list()
    assert str(file) in str(info.value)
    assert info.value.path == str(file)


def test_crc_valid_but_not_json_is_corrupt(tmp_path: Path) -> None:
    meta = MetadataStore(str(tmp_path / "meta"))
    meta.write("member_list", b"{not json")
    with pytest.raises(CorruptMetadataError, match="bad JSON"):
        meta.read_member_list()


def test_bad_arguments(tmp_path: Path) -> None:
    meta = MetadataStore(str(tmp_path / "meta"))
    with pytest.raises(TypeError):
        meta.write_cluster_state(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        meta.write_partition_table("text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="metadata name"):
        meta.write("../escape", b"")
