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


# Waits for a line on stdin, burns 0.3 s of CPU (with ``spawn``: in a child it then reaps),
# says "done" and waits for stdin to close.
_BURNER = """
import subprocess, sys, time
sys.stdin.readline()
if sys.argv[1:] == ["spawn"]:
    subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time()\\n"
                    "while time.process_time() - t < 0.3: pass"], check=True)
else:
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
print("done", flush=True)
sys.stdin.read()
"""

# Run in a process of its own: ``cpu_by_kind`` counts every Python process under the one
# that calls it, and under the test run's process another test's may be exiting meanwhile
# (its CPU then leaves the count: a run of the suite once measured -0.1 s of "Spark Python").
_MEASURER = """
import json, subprocess, sys
from pathlib import Path
import psutil
sys.path.insert(0, sys.argv[1])
import bench_spark
tmp, burner = Path(sys.argv[2]), sys.argv[3]
commands = {"member": [str(tmp / "shmgrid-member"), "-c", burner],
            "jvm": [str(tmp / "java"), "-c", burner],
            "daemon": [sys.executable, "-c", burner, "spawn"]}
processes = {kind: subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    text=True) for kind, command in commands.items()}
try:
    members = [psutil.Process(processes["member"].pid)]
    before = bench_spark.cpu_by_kind(members)
    for process in processes.values():
        process.stdin.write("go\\n")
        process.stdin.flush()
    for process in processes.values():
        assert process.stdout.readline() == "done\\n"
    after = bench_spark.cpu_by_kind(members)
finally:
    for process in processes.values():
        process.stdin.close()
        process.wait(timeout=30)
print(json.dumps({kind: after[kind] - before[kind] for kind in bench_spark.CPU_KINDS}))
"""


def test_bench_spark_counts_cpu_by_kind_of_process_with_exited_workers(tmp_path):
    """tools/bench_spark.py's CPU by kind: a member (by the list given), a JVM (a process named
    java under this one) and a Python worker that exited within the window (reaped by its
    parent, as the PySpark daemon reaps its workers) each count their 0.3 s."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    for name in ("java", "shmgrid-member"):  # /proc/PID/comm is the name executed
        (tmp_path / name).symlink_to(sys.executable)
    tools = Path(__file__).resolve().parents[2] / "tools"
    done = subprocess.run([sys.executable, "-c", _MEASURER, str(tools), str(tmp_path), _BURNER],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    spent = json.loads(done.stdout)
    assert spent["members"] >= 0.25, spent
    assert spent["Spark JVM"] >= 0.25, spent
    assert spent["Spark Python"] >= 0.25, spent  # the exited grandchild, through the daemon
    assert spent["this process"] < 0.25, spent


def test_put_all_shapes_reach_the_members_and_partitions_they_say(grid_cluster,
                                                                  cluster_factory):
    """tools/bench_put_all_shapes.py: each shape's keys lie where its name says (a ring's
    partitions are backed up by the member after their owner, one pair's by one owner and
    one backup, the few partitions one per owner and backup pair), and the tool prints a row
    a shape against a running cluster with spread backups, and leaves its map empty; it
    refuses one with paired backups (the default), where the shapes are one."""
    import subprocess
    import sys
    from pathlib import Path

    tools = Path(__file__).resolve().parents[2] / "tools"
    sys.path.insert(0, str(tools))
    try:
        from bench_put_all_shapes import SHAPES, shaped_keys
    finally:
        sys.path.remove(str(tools))
    with grid_cluster.connect() as client, pytest.raises(SystemExit, match="spread"):
        shaped_keys(client, 300)
    spread = cluster_factory(members=3, backup_placement="spread")
    with spread.connect() as client:
        shaped = shaped_keys(client, 300)
        replicas = client.partition_replicas()
        owners = sorted({row[0] for row in replicas.values()})
        pairs = {shape: {tuple(replicas[client.partition_id(k)][:2]) for k in keys}
                 for shape, keys in shaped.items()}
        few = {client.partition_id(k) for k in shaped["few partitions"]}
    assert all(len(keys) == 300 for keys in shaped.values())
    assert len(pairs["spread"]) == 6
    assert all(owners.index(b) == (owners.index(o) + 1) % 3 for o, b in pairs["ring"])
    assert len(pairs["ring"]) == 3 and len(pairs["one pair"]) == 1
    assert len(few) == 6
    out = subprocess.run([sys.executable, str(tools / "bench_put_all_shapes.py"),
                          "--cluster-name", spread.cluster_name, "--keys", "300",
                          "--seconds", "0.2", "--rounds", "1"],
                         capture_output=True, text=True, timeout=100, check=True).stdout
    # (A cell too wide for the terminal wraps onto a line of its own, empty in column 1.)
    rows = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")]
    assert [row for row in rows if row] == list(SHAPES), out
    with spread.connect() as client:
        assert client.get_map("put_all_shapes").size() == 0


def test_bench_record_store_prints_a_bulk_load_unpublished_and_published() -> None:
    """tools/bench_record_store.py: each store operation's rate, then a bulk load's µs a row
    into a store of its own and into a published one, with the shared index's part of the
    latter (built once the load is over: it ran); no segment left (the tool exits 1)."""
    import subprocess
    import sys
    from pathlib import Path

    tool = Path(__file__).resolve().parents[2] / "tools" / "bench_record_store.py"
    out = subprocess.run([sys.executable, str(tool), "--keys", "300", "--block-rows", "30000",
                          "--partitions", "7"],
                         capture_output=True, text=True, timeout=100, check=True).stdout
    assert "get (hit)" in out and "30,000 new keys over 7 partitions" in out, out
    loads = {line.rsplit(None, 4)[0].strip(): float(line.split()[-4])
             for line in out.splitlines() if line.endswith("µs a row")}
    assert list(loads) == ["block load, unpublished", "block load, published",
                           "of it, shared index build"], out
    assert all(micros > 0 for micros in loads.values()), out
    assert loads["of it, shared index build"] < loads["block load, published"], out
