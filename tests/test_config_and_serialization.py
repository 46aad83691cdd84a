import subprocess
import sys
import threading

import mmh3
import msgpack
import pytest

from grid import errors, serialization
from grid import protocol as p
from grid.config import GridConfig
from grid.serialization import (
    INT32_MIN,
    decode_concatenated,
    deserialize_key,
    partition_id_of,
    partition_ids_of,
    place_keys,
    placement_bytes,
    serialize_key,
    serialize_value,
)


def test_defaults_are_the_seeds():
    c = GridConfig()
    assert (c.partition_count, c.backup_count, c.max_parallel_migrations) == (271, 1, 10)
    assert c.migration_fragments_enabled and not c.migration_stale_read_disabled
    assert c.backup_sync_interval == 30 and c.heartbeat_interval == 1
    assert c.heartbeat_timeout == 10 and c.invocation_timeout == 60


def test_toml_then_env_then_arguments(tmp_path):
    f = tmp_path / "grid.toml"
    f.write_text('[shmgrid]\nbackup_count = 2\npartition_count = 31\nmembers = 5\n')
    env = {"SHMGRID_PARTITION_COUNT": "17", "SHMGRID_MIGRATION_FRAGMENTS_ENABLED": "false"}
    c = GridConfig.load(f, env=env, members=4)
    assert (c.backup_count, c.partition_count, c.members) == (2, 17, 4)
    assert c.migration_fragments_enabled is False
    assert c.backup_placement == "paired"
    assert GridConfig.load(env={"SHMGRID_BACKUP_PLACEMENT": "spread"}).backup_placement == \
        "spread"


@pytest.mark.parametrize("kwargs", [{"backup_count": 7}, {"partition_count": 0},
                                    {"cluster_name": "a-b"}, {"heartbeat_timeout": 0.5},
                                    {"backup_count": 4, "async_backup_count": 3},
                                    {"client_busy_poll_us": -1},
                                    {"backup_placement": "clustered"}])
def test_bad_configuration_is_refused_with_a_reason(kwargs):
    with pytest.raises(ValueError, match="invalid configuration"):
        GridConfig(**kwargs)


def test_unknown_key_and_bad_env_value():
    with pytest.raises(ValueError, match="unknown configuration keys: colour"):
        GridConfig.load(env={}, colour="red")
    with pytest.raises(ValueError, match="SHMGRID|backup_count"):
        GridConfig.load(env={"SHMGRID_BACKUP_COUNT": "two"})


def test_partition_of_a_key_is_the_non_negative_murmur3_of_its_bytes():
    kb = serialize_key("o1")
    h = mmh3.hash(kb, 0, True)
    assert partition_id_of(kb, 271) == abs(h) % 271
    assert partition_id_of(kb, 271) == partition_id_of(serialize_key("o1"), 271)


@pytest.mark.parametrize(("key", "placed_as"), [
    ("{user42}:cart", "user42"),
    ("orders:{user42}", "user42"),
    ("a{b}c{d}", "b"),  # the first "{" and the first "}" after it
    ("x}{y}", "y"),
    ("{ü}x", "ü"),
    ("{" + "t" * 40 + "}x", "t" * 40),  # a tag whose own header is longer (str 8)
    ("{" + "t" * 300 + "}x", "t" * 300),  # (str 16)
    (b"{user42}:cart", b"user42"),  # bytes keys are tagged too, as bytes
    ("{}x", "{}x"),  # an empty tag: the whole key places it, as in Redis
    ("{}{x}", "{}{x}"),
    ("{open", "{open"),
    ("close}", "close}"),
    ("plain", "plain"),
    (123, 123),  # packs as b"{": an int is never tagged
    (("{a}", 1), ("{a}", 1)),  # nor is a tuple
])
def test_a_hash_tag_places_a_key_as_the_tag_alone_would_be(key, placed_as):
    """Redis Cluster's rule: a batch of keys that share a tag is one partition."""
    assert placement_bytes(serialize_key(key)) == serialize_key(placed_as)
    assert partition_id_of(serialize_key(key), 271) == partition_id_of(
        serialize_key(placed_as), 271)


def test_tagged_keys_share_one_partition_and_untagged_ones_spread():
    tagged = {partition_id_of(serialize_key(f"{{cart-7}}:item-{i}"), 271) for i in range(200)}
    plain = {partition_id_of(serialize_key(f"cart-7:item-{i}"), 271) for i in range(200)}
    assert len(tagged) == 1 and len(plain) > 100


BATCH_KEYS = [
    ["o1", "o2", "ü", "x" * 40],  # all str, no tag: one hash pass
    ["o1", 42, 3.5, True, b"raw", ("a", 1, (b"x", False)), "{t}1", b"{t}2", "x}{y}"],
    [f"{{cart-{i % 3}}}:{i}" for i in range(30)] + ["plain", 123, "{}x", "{open"],
    ["a" * 123, "b" * 300],  # str 8 and str 16 headers: 123 is the byte of "{"
    [f"{{user42}}:{i}" for i in range(50)],  # str keys that all begin with one tag
    ["{user42}:a", "{user42}b", "{user42}"],  # ... of different shapes
    ["{{a}x", "{{a}y"],  # a tag that holds a "{"
    ["{a}x", "{a}y", "{b}z"],  # one key with another tag
    ["{a}x", "{a", "{a}}"],  # one that begins with the tag's text but has none
    ["{}x", "{}y"],  # an empty tag is none: the whole key places it
    ["{a}x", "z{a}x", "z{b}", "z}{c}", "é{ü}", "z{}{d}", "plain", "{" + "t" * 40 + "}x"],
    [],
]


@pytest.mark.parametrize("keys", BATCH_KEYS)
def test_a_batch_of_keys_serializes_and_places_as_its_keys_one_by_one(keys):
    """The client's get_all places a batch in C-level passes, and a batch of str keys by
    their str; it must agree with the single-key functions for every kind of key, tagged
    or not."""
    keys_bytes = [serialize_key(key) for key in keys]
    for count in (1, 7, 271):
        pids = [partition_id_of(kb, count) for kb in keys_bytes]
        assert place_keys(keys, count) == (keys_bytes, pids)
        assert partition_ids_of(keys_bytes, count) == pids


def test_a_batch_refuses_what_a_single_key_refuses():
    with pytest.raises(errors.KeyNotSerializableError):
        place_keys(["fine", [1, 2]], 271)


@pytest.mark.parametrize("keys", [["a", "b", "c"], ["{x}a", "{y}b", "{z}c"],
                                  ["{x}a", "{x}b", "{x}c"]])
def test_a_batch_places_the_one_hash_made_non_negative_by_hand_as_a_single_key(
        monkeypatch, keys):
    """abs(INT32_MIN) is not an int32: such a hash places a key at 0 (the reference
    client's rule), in a batch as for one key, whatever path the batch takes. No short key
    is known to hash to it, so the hash is replaced for one key's placement bytes."""
    keys_bytes = [serialize_key(key) for key in keys]
    placing = placement_bytes(keys_bytes[1])
    real = mmh3.hash
    monkeypatch.setattr(serialization, "_hash32",
                        lambda kb: INT32_MIN if kb == placing else real(kb))
    pids = place_keys(keys, 271)[1]
    assert pids[1] == 0 == partition_id_of(keys_bytes[1], 271)
    assert pids == partition_ids_of(keys_bytes, 271) == [
        partition_id_of(kb, 271) for kb in keys_bytes]


def test_same_partition_in_another_process():
    keys = ["o1", 42, 3.5, True, b"raw", ("a", 1, (b"x", False)), "{t}1", b"{t}2"]
    ours = [partition_id_of(serialize_key(k), 271) for k in keys]
    code = ("from grid.serialization import *;"
            f"print([partition_id_of(serialize_key(k), 271) for k in {keys!r}])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PYTHONHASHSEED": "123", "PATH": ""})
    assert out.stdout.strip() == str(ours)


@pytest.mark.parametrize("key", [None, [1, 2], {"a": 1}, object(), ("a", [1]), 2**70])
def test_keys_that_cannot_be_keys(key):
    with pytest.raises(errors.KeyNotSerializableError, match="cannot be a grid key"):
        serialize_key(key)


def test_keys_round_trip_with_tuples():
    for key in ["s", b"b", 1, -5, 2.5, False, ("t", (1, b"x"))]:
        assert deserialize_key(serialize_key(key)) == key


def test_values_that_cannot_be_serialized():
    with pytest.raises(errors.ValueNotSerializableError):
        serialize_value(object())


def test_concatenated_decode_of_any_count():
    for n in (0, 1, 15, 16, 17, 70000):
        items = [serialize_value(i) for i in range(n)]
        assert decode_concatenated(b"".join(items), n) == list(range(n))


def test_error_replies_become_the_right_exceptions():
    def err(code, **fields):
        return p.error_from_reply(p.unpack_header(p.reply_error(1, code, "m", **fields)))

    assert isinstance(err(p.WRONG_TARGET), errors.WrongTargetError)
    assert err(p.WRONG_TARGET).retryable and err(p.MEMBER_LEFT).retryable
    assert isinstance(err(p.STATE, op="put", state="PASSIVE"), errors.ClusterStateError)
    assert isinstance(err(p.LITE, member="m", op="get"), errors.MemberIsLiteError)
    assert isinstance(err(p.TOO_LARGE, size=9, limit=1), errors.ValueTooLargeError)
    assert isinstance(err("whatever"), errors.ServerError)
    assert not err(p.PROTOCOL).retryable


def test_header_packing_matches_packb_in_every_thread_and_after_a_large_or_bad_header():
    """pack_header keeps a Packer per thread: its output is packb's, in any thread, after a
    header it refused, and after one large enough that its Packer is dropped."""
    header = {"op": "get", "id": 7, "c": "cluster", "ns": "m", "pid": 3, "b": b"\x00"}
    large = {"table": ["x" * 100] * (p.KEEP_PACKER_BYTES // 50)}
    with pytest.raises(TypeError):
        p.pack_header({"bad": object()})
    assert p.pack_header(header) == msgpack.packb(header, use_bin_type=True)
    assert p.pack_header(large) == msgpack.packb(large, use_bin_type=True)
    assert not hasattr(p._packers, "pack"), "a Packer that grew that large is dropped"
    assert p.pack_header(header) == msgpack.packb(header, use_bin_type=True)
    results: list[bytes] = []

    def pack_many() -> None:
        results.extend(p.pack_header({**header, "id": i}) for i in range(2000))

    threads = [threading.Thread(target=pack_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == sorted(msgpack.packb({**header, "id": i}, use_bin_type=True)
                                     for _ in threads for i in range(2000))


@pytest.mark.parametrize("frame", [b"", b"\xc1", b"\x93\x01\x02\x03", b"\xa3abc", b"\x81"])
def test_undecodable_headers_are_protocol_errors(frame):
    with pytest.raises(errors.ProtocolError):
        p.unpack_header(frame)
