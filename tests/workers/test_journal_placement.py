"""A member's folder written before keys were placed by their hash tag (grid/serialization.py)
loads only if none of its keys now belongs to another partition; it is refused otherwise,
with nothing lost."""

from __future__ import annotations

import json

import mmh3
import pytest

from grid.serialization import INT32_MIN, partition_id_of, serialize_key
from workers.journal import KEY_PLACEMENT, Journal, JournalError

COUNT = 271


def _open(folder) -> Journal:
    return Journal(str(folder), "member-0", "c", COUNT, "interval", 0.05)


def _whole_key_partition(key_bytes: bytes) -> int:
    """Where a key was placed before hash tags: by all of its bytes."""
    h = mmh3.hash(key_bytes, 0, True)
    return (0 if h == INT32_MIN else abs(h)) % COUNT


def _old_folder(folder, keys: list[str]) -> None:
    """A folder as the version before hash tags left it: each key in its whole key's
    partition, and an identity without ``key_placement``."""
    journal = _open(folder)
    journal.save_identity("u-1")
    journal.restore(lambda pid, ns, pairs: None)
    for key in keys:
        key_bytes = serialize_key(key)
        journal.put(_whole_key_partition(key_bytes), "m", key_bytes, b"\xa1v")
    journal.flush()
    journal.close()
    identity_file = folder / "meta" / "identity.meta"
    assert identity_file.exists()
    identity = json.loads(journal.meta.read("identity"))
    del identity["key_placement"]
    journal.meta.write("identity", json.dumps(identity).encode())


def _identity(folder) -> dict:
    return json.loads(_open(folder).meta.read("identity"))


def test_a_new_folder_says_how_its_keys_are_placed(tmp_path):
    journal = _open(tmp_path)
    journal.save_identity("u-1")
    journal.restore(lambda pid, ns, pairs: None)
    journal.close()
    assert _identity(tmp_path)["key_placement"] == KEY_PLACEMENT


def test_an_old_folder_without_tagged_keys_loads_and_is_marked(tmp_path):
    keys = ["plain", "no tag {", "{}empty", "x}{"]
    for key in keys:  # every one of them places as before
        assert partition_id_of(serialize_key(key), COUNT) == _whole_key_partition(
            serialize_key(key))
    _old_folder(tmp_path, keys)
    loaded = []
    journal = _open(tmp_path)
    journal.save_identity("u-1")
    journal.restore(lambda pid, ns, pairs: loaded.extend(key for key, _ in pairs))
    journal.close()
    assert sorted(loaded) == sorted(map(serialize_key, keys))
    assert _identity(tmp_path)["key_placement"] == KEY_PLACEMENT


def test_an_old_folder_whose_tagged_key_would_move_is_refused_until_read_by_its_version(
        tmp_path):
    moved = "{user42}:cart"
    key_bytes = serialize_key(moved)
    assert partition_id_of(key_bytes, COUNT) != _whole_key_partition(key_bytes)
    _old_folder(tmp_path, ["plain", moved])
    for _ in range(2):  # refused again on the next start: the check is not forgotten
        journal = _open(tmp_path)
        journal.save_identity("u-1")
        with pytest.raises(JournalError, match=r"hash tag.*1 key\(s\) of map 'm'"):
            journal.restore(lambda pid, ns, pairs: None)
        journal.close()
        assert "key_placement" not in _identity(tmp_path)


def test_a_folder_of_an_unknown_placement_is_refused(tmp_path):
    journal = _open(tmp_path)
    journal.save_identity("u-1")
    journal.close()
    journal.meta.write("identity", json.dumps({**journal.identity,
                                               "key_placement": "crc16"}).encode())
    with pytest.raises(JournalError, match="places keys by 'crc16'"):
        _open(tmp_path)
