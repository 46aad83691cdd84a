"""The benchmark commands run against a real cluster and print their table (no speeds asserted)."""

import pytest

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("clients", ["1", "2"])
def test_bench_prints_every_operation(grid_cluster, clients):
    out = grid_cluster.cli("bench", "--seconds", "0.2", "--keys", "300", "--clients", clients,
                           "--map", f"bench{clients}").stdout
    for op in ("put", "get", "put_all (100)", "get_all (100)", "entries/s", "p99 ms"):
        assert op in out
    assert f"{clients} client process" in out
    # The members' CPU per entry while each operation ran (found through the registry).
    assert "member CPU µs/entry" in out, out
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines()
            if line.startswith("│")]
    assert [row[0] for row in rows] == ["put", "get", "put_all (100)", "get_all (100)"], out
    assert all(float(row[-1].replace(",", "")) > 0 for row in rows), out
    with grid_cluster.connect() as client:
        assert client.get_map(f"bench{clients}").size() == 0, "the bench cleans up its map"


def test_bench_with_hash_tags_writes_each_batch_to_one_partition(grid_cluster):
    from grid.bench import BATCH, _tagged

    keys = _tagged([f"key-{i}" for i in range(3 * BATCH)], client=1)
    with grid_cluster.connect() as client:
        batches = [keys[i:i + BATCH] for i in range(0, len(keys), BATCH)]
        assert [len({client.partition_id(k) for k in batch}) for batch in batches] == [1] * 3
    out = grid_cluster.cli("bench", "--seconds", "0.2", "--keys", "300", "--hash-tags",
                           "--map", "bench-tags").stdout
    assert "one hash tag a batch" in out and "put_all (100)" in out, out
