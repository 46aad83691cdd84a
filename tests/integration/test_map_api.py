"""The map API against a real 3-member cluster."""

import pytest

import grid
from grid import errors
from grid import protocol as p
from grid.client.map import PLACE_SLICE
from grid.serialization import partition_id_of, serialize_key

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def client(grid_cluster):
    with grid_cluster.connect() as c:
        yield c


def test_single_key_operations(client, request):
    m = client.get_map(request.node.name)
    assert m.get("o1") is None
    assert m.put("o1", {"qty": 3}) is None
    assert m.get("o1") == {"qty": 3}
    assert m.put("o1", {"qty": 4}) == {"qty": 3}
    m.set("o2", [1, 2, 3])
    assert m.get("o2") == [1, 2, 3]
    assert m.put_if_absent("o2", "x") == [1, 2, 3]
    assert m.put_if_absent("o3", "x") is None and m.get("o3") == "x"
    assert m.replace("o4", "y") is None and not m.contains_key("o4")
    assert m.replace("o3", "z") == "x" and m.get("o3") == "z"
    assert m.contains_key("o1") and "o1" in m
    assert m.remove("o1") == {"qty": 4} and m.get("o1") is None
    assert m.remove("o1") is None
    m.delete("o2")
    assert m.size() == 1 and len(m) == 1
    m["o5"] = 5
    assert m["o5"] == 5
    with pytest.raises(KeyError):
        m["nope"]


def test_every_key_type(client, request):
    m = client.get_map(request.node.name)
    keys = ["s", b"bytes", 7, -3, 2.5, True, ("t", 1, (b"x", 2.0))]
    for i, k in enumerate(keys):
        m.put(k, {"i": i, "nested": {"list": [1, "a", None]}, "b": b"\x00"})
    for i, k in enumerate(keys):
        assert m.get(k)["i"] == i
    assert set(m.keys()) == set(keys)
    assert m.get_all(keys)[("t", 1, (b"x", 2.0))]["i"] == 6


def test_batches_and_scans(client, request):
    m = client.get_map(request.node.name)
    data = {f"k{i}": {"n": i} for i in range(5000)}
    m.put_all(data)
    assert m.size() == 5000
    got = m.get_all(list(data)[:1000] + ["missing"])
    assert got == {k: data[k] for k in list(data)[:1000]}
    assert dict(m.items()) == data
    assert sorted(m.values(), key=lambda v: v["n"]) == list(data.values())
    batches = list(m.scan_partitions(range(client.partition_count), batch_size=1000))
    assert sum(len(k) for k, _ in batches) == 5000
    assert all(len(k) == len(v) for k, v in batches)
    m.clear()
    assert m.size() == 0 and m.items() == []
    written: set[int] = {3}  # added to, not replaced
    m.put_all_into(((key, 1) for key in ["a", ("t", 1), 7, *data]), written)
    assert written == {3} | {client.partition_id(k) for k in ["a", ("t", 1), 7, *data]}
    assert m.size() == 5003


def test_keys_with_one_hash_tag_live_in_one_partition(client, request):
    """Co-location: keys that share a hash tag are written, read and scanned as one
    partition, with the tag's own key; through the owners and through shared memory."""
    m = client.get_map(request.node.name)
    data = {f"{{cart-7}}:item-{i}": i for i in range(300)}
    m.put_all(data)
    m.put("cart-7", "the cart")
    pid = client.partition_id("cart-7")
    assert {client.partition_id(k) for k in data} == {pid}
    assert m.get_all(list(data)) == data and m.get("{cart-7}:item-5") == 5
    (keys, values), = m.scan_partitions([pid])
    assert dict(zip(keys, values, strict=True)) == {**data, "cart-7": "the cart"}
    local = client.get_map(request.node.name, local_reads=True)
    assert local.get_all(list(data)) == data and local.get("{cart-7}:item-299") == 299
    assert local.local_reads
    assert m.remove("{cart-7}:item-0") == 0 and m.size() == 300


def test_scans_come_in_bounded_chunks(client, request):
    """A scan with a small chunk size gets no reply much larger than it, and every entry
    once, also while other entries are written between its chunks."""
    m = client.get_map(request.node.name)
    data = {f"k{i}": "v" * 500 for i in range(4000)}  # about 7 KiB a partition
    m.put_all(data)
    invoker = m._invoker
    replies: list[int] = []
    exchange = invoker.exchange

    def counting(requests, timeout, replicas=1):
        answered = exchange(requests, timeout, replicas)
        if requests[0][1] == p.ENTRIES:
            replies.extend(sum(map(len, reply[1])) for reply in answered if reply)
        return answered

    invoker.exchange = counting
    scanned = []
    for n, (keys, _values) in enumerate(m.scan_partitions(range(client.partition_count),
                                                           batch_size=50,
                                                           chunk_bytes=2_000)):
        scanned += keys
        m.put(f"new{n}", "written mid-scan")  # may or may not be seen; never twice
        m.put(f"k{n}", "w" * 900)  # a rewritten entry: at most once
    assert max(replies) <= 2_000 + 600, "a reply holds about chunk_bytes"
    assert len(replies) > client.partition_count, "partitions came in several chunks"
    assert len(scanned) == len(set(scanned)), "no entry twice"
    assert set(data) <= set(scanned), "every entry present throughout is scanned"
    with pytest.raises(ValueError, match="chunk_bytes"):
        next(m.scan_partitions([0], chunk_bytes=0))


def test_a_partition_that_fits_a_chunk_comes_whole(client, request):
    """A partition that would not fit in what is left of a reply waits for a reply of its
    own rather than being split: it then comes in one piece, a snapshot of it."""
    m = client.get_map(request.node.name)
    data = {f"k{i}": "v" * 500 for i in range(4000)}  # about 7.5 KB a partition
    m.put_all(data)
    per_partition: dict[int, int] = {}
    for key in data:
        pid = client.partition_id(key)
        per_partition[pid] = per_partition.get(pid, 0) + 1
    invoker = m._invoker
    chunks: dict[int, list[tuple[int, object]]] = {}
    exchange = invoker.exchange

    def recording(requests, timeout, replicas=1):
        answered = exchange(requests, timeout, replicas)
        for reply in answered:
            if reply and requests[0][1] == p.ENTRIES:
                header = reply[0]
                for pid, n, bound in zip(header["pids"], header["counts"], header["next"],
                                         strict=True):
                    chunks.setdefault(pid, []).append((n, bound))
        return answered

    invoker.exchange = recording
    scanned = [k for keys, _ in m.scan_partitions(range(client.partition_count),
                                                  chunk_bytes=20_000) for k in keys]
    assert sorted(scanned) == sorted(data)
    for pid, count in per_partition.items():
        pieces = [(n, bound) for n, bound in chunks[pid] if n]
        assert pieces == [(2 * count, None)], f"partition {pid} came as {chunks[pid]}"


def test_maps_are_separate_namespaces(client, request):
    a = client.get_map(request.node.name + "-a")
    b = client.get_map(request.node.name + "-b")
    a.put("k", 1)
    b.put("k", 2)
    assert (a.get("k"), b.get("k")) == (1, 2)
    a.clear()
    assert b.get("k") == 2


def test_move_to_replaces_the_target(client, request):
    stage = client.get_map(request.node.name + "-stage")
    target = client.get_map(request.node.name + "-target")
    target.put_all({f"old{i}": i for i in range(100)})
    stage.put_all({f"new{i}": i for i in range(50)})
    stage.move_to(target.name)
    assert stage.size() == 0
    assert dict(target.items()) == {f"new{i}": i for i in range(50)}


def test_partition_ids_and_cluster_view(client):
    assert client.partition_count == 271
    assert client.partition_id("o1") == partition_id_of(serialize_key("o1"), 271)
    members = client.cluster.members
    assert len(members) == 3 and client.cluster.master.name == "member-0"
    assert client.cluster.state == "ACTIVE"
    assert client.cluster.is_safe()
    owners = client.partition_owners()
    assert len(owners) == 271 and set(owners.values()) == {m.uuid for m in members}


def test_connect_by_address(grid_cluster):
    with grid.connect(grid_cluster.address) as c:
        assert c.cluster_name == grid_cluster.cluster_name
        c.get_map("by-address").put("k", "v")
        assert c.get_map("by-address").get("k") == "v"
    with pytest.raises(errors.WrongClusterNameError, match="belongs to cluster"):
        grid.connect(grid_cluster.address, cluster_name="other")


def test_put_all_takes_pairs_of_any_keys_beyond_a_slice(client, request):
    """put_all places its pairs a slice at a time (str keys by their str, one hash for a
    slice of one hash tag): every pair lands where get, which places a key by itself,
    finds it, from a dict or an iterator, whatever the mix of keys."""
    m = client.get_map(request.node.name)
    mixed = {(f"{{t{i % 3}}}:{i}" if i % 2 else i if i % 5 else f"k{i}"): i
             for i in range(2 * PLACE_SLICE + 10)}
    tagged = {(f"{{s{i % 3}}}:{i}" if i % 2 else f"x{{s}}{i}" if i % 5 else f"s{i}"): i
              for i in range(PLACE_SLICE + 10)}  # str keys only: tags found in the str
    one_tag = ((f"{{cart}}:{i}", -i) for i in range(PLACE_SLICE + 1))
    m.put_all(mixed)
    m.put_all(tagged)
    m.put_all(one_tag)
    assert {key: m.get(key) for key in [*mixed, *tagged]} == {**mixed, **tagged}
    assert m.size() == len(mixed) + len(tagged) + PLACE_SLICE + 1
    (keys, values), = m.scan_partitions([client.partition_id("cart")])
    assert {k: v for k, v in zip(keys, values, strict=True) if str(k).startswith("{cart}")} \
        == {f"{{cart}}:{i}": -i for i in range(PLACE_SLICE + 1)}


def test_user_errors(client, grid_cluster, request):
    m = client.get_map(request.node.name)
    with pytest.raises(errors.KeyNotSerializableError):
        m.put(["a", "list"], 1)
    with pytest.raises(errors.KeyNotSerializableError):
        m.get({"a": 1})
    with pytest.raises(errors.ValueNotSerializableError):
        m.put("k", object())
    with pytest.raises(errors.ValueNotSerializableError):
        m.put_all({"k": 1, "k2": object()})
    with pytest.raises(errors.KeyNotSerializableError):
        m.put_all([("k", 1), (["a", "list"], 2)])
    with pytest.raises(ValueError):
        m.put_all([("k", 1), ("k2", 2, 3)])
    with grid.connect(cluster_name=grid_cluster.cluster_name,
                      config=grid.GridConfig(cluster_name=grid_cluster.cluster_name,
                                             max_value_bytes=1000)) as small:
        with pytest.raises(errors.ValueTooLargeError, match="1000"):
            small.get_map("m").put("k", b"x" * 2000)
        with pytest.raises(errors.ValueTooLargeError):
            small.get_map("m").put_all({"k": b"x" * 2000})
    assert m.size() == 0, "nothing was written by refused calls"
    with pytest.raises(ValueError):
        client.get_map("")


def test_no_cluster_errors(tmp_path):
    with pytest.raises(errors.ClusterNotRunningError, match="nothere.json"):
        grid.connect(cluster_name="nothere")
    with pytest.raises(errors.ClusterNotRunningError):
        grid.connect("tcp://127.0.0.1:9", invocation_timeout=2)
    for address in ("nothere", "tcp://127.0.0.1", "127.0.0.1:5555", "tcp://a b:1"):
        with pytest.raises(ValueError, match="not a member's address"):
            grid.connect(address)  # (a cluster name passed as the address hung here once)
