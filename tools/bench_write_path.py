"""The members' write path for one batch, in one process: what a put_all of 100 keys costs the
owners, the backups and the acknowledgements, without sockets, scheduling or a second client.

    python tools/bench_write_path.py                          # µs per batch, 81 and 1 partitions
    python tools/bench_write_path.py --base HEAD~2            # and a revision's, alternately
    python tools/bench_write_path.py --base HEAD~2 --instructions   # valgrind counts instead

Three simulated members (tests/cluster/sim.py: the very MapService and ClusterService a member
process runs, with the transport replaced; backup 1, 271 partitions) form a cluster. Then each
round a put_all of 100 keys with 100-byte values, spread over ``--partitions`` partitions, goes
to its owners as the client sends it (one message per owner), and the messages they send are
delivered by hand, in three phases timed apart: the owners handle the requests (store writes,
versions, backup operations), the backups apply the operations, and the owners take the
acknowledgements (and answer). Keys are overwritten in place after the first rounds, as in a
steady workload.

Timings on a small shared virtual machine drift 20-40% from one minute to the next; each tree
runs in turn, ``--rounds`` times, and the best 20-batch stretch of each run is kept. With
``--instructions`` each tree's runs go under valgrind's cachegrind instead (Debian's valgrind
package), with PYTHONHASHSEED fixed: the instructions per batch are a run of ``--batches``
batches less a run of none. They do not repeat exactly: a run's count varies by tens of
millions of instructions from one run to the next (a bare ``import`` of the member's modules
by 1%), and now and then one is 100 million or more off. So each is the median of three
runs, and the spreads of the two sets of runs, per batch, are printed as its uncertainty;
more ``--batches`` shrink it (200 by default). An instruction is not a
time (a memcpy runs many a nanosecond, Python's dispatch few), so a change worth keeping shows
in both. ``--base`` needs a revision whose tests/cluster/sim.py has ``SimNetwork``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from worktrees import compared_trees

ROOT = Path(__file__).resolve().parent.parent
WARM_UP = 20
STRETCH = 20  # batches per timed stretch; the best stretch of a run is what it reports

# Run by the tree being measured (its own code, its own simulation); prints one JSON line.
RUNNER = r"""
import json, random, sys, time
from grid import protocol as p
from grid.config import GridConfig
from grid.serialization import partition_id_of, serialize_key, serialize_value
from tests.cluster.sim import SimNetwork

spread, batches_run, stretch, warm_up = map(int, sys.argv[1:5])
PARTITIONS = 271
config = GridConfig(cluster_name="bench_write_path", partition_count=PARTITIONS,
                    backup_count=1, heartbeat_interval=0.2, heartbeat_timeout=5.0,
                    invocation_timeout=5.0, cluster_secret="bench-secret")
net = SimNetwork(1, config)
try:
    first = net.add_node([])
    for _ in range(2):
        net.add_node([first.info.endpoint])
    while len(first.cluster.members) < 3:
        assert net.time < 30, "every member joined"
        net.run_until(net.time + 0.1)
    net.send(b"supervisor", first.info.endpoint, lambda: first.deliver(
        b"supervisor", p.request(p.FORM, 0, config.cluster_name, k=config.cluster_secret), []))
    net.run_until(net.time + 2.0)
    table = first.cluster.table
    assert table.is_assigned(), "the cluster formed"

    class Client:
        def on_reply(self, frames):
            pass

    ident = b"bench-client"
    net.clients[ident] = Client()
    by_uuid = {node.info.uuid: node for node in net.nodes.values()}
    keys_of = {}
    i = 0
    while len(keys_of) < PARTITIONS or min(map(len, keys_of.values())) < 50:
        key = serialize_key(f"key{i}")
        keys_of.setdefault(partition_id_of(key, PARTITIONS), []).append(key)
        i += 1
    rng = random.Random(2)
    value = serialize_value(b"v" * 100)
    batches = []
    for _ in range(50):
        pids = rng.sample(range(PARTITIONS), spread)
        batch = {}
        for j in range(100):
            pid = pids[j % spread]
            batch.setdefault(pid, {})[rng.choice(keys_of[pid])] = value
        batches.append(batch)
    sent = []
    net.send = lambda source, target, deliver, sender=None: sent.append(deliver)
    rid = 0
    stretches, current = [], [0.0, 0.0, 0.0]
    for n in range(warm_up + batches_run):
        batch = batches[n % len(batches)]
        by_owner = {}
        for pid in batch:
            by_owner.setdefault(table.owner(pid), []).append(pid)
        requests = []
        for owner, pids in by_owner.items():
            rid += 1
            items = [item for pid in pids for pair in batch[pid].items() for item in pair]
            # One invocation id for the whole batch, as grid/client/map.py sends it.
            head = p.request(p.PUT_ALL, rid, config.cluster_name, ns="bench", pids=pids,
                             counts=[len(batch[pid]) for pid in pids], iid=f"i{n}",
                             cid="bench-client")
            requests.append((by_uuid[owner], head, [p.pack_items(items)]))
        t0 = time.perf_counter()
        for node, head, frames in requests:
            node.on_request(ident, head, frames)
        t1 = time.perf_counter()
        backups, sent[:] = list(sent), []
        for deliver in backups:
            deliver()
        t2 = time.perf_counter()
        while sent:
            rest, sent[:] = list(sent), []
            for deliver in rest:
                deliver()
        t3 = time.perf_counter()
        if n >= warm_up:
            current = [current[0] + t1 - t0, current[1] + t2 - t1, current[2] + t3 - t2]
            if (n - warm_up + 1) % stretch == 0:
                stretches.append(current)
                current = [0.0, 0.0, 0.0]
    best = min(stretches, key=sum) if stretches else [0.0, 0.0, 0.0]
    print(json.dumps({"owners": best[0] / stretch * 1e6, "backups": best[1] / stretch * 1e6,
                      "acks": best[2] / stretch * 1e6}))
finally:
    net.close()
"""


def run(tree: Path, spread: int, batches: int, valgrind: bool = False) -> dict | int:
    """One run of ``RUNNER`` by ``tree``'s code: its JSON, or with ``valgrind`` the
    instructions it executed."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-c", RUNNER, str(spread), str(batches), str(STRETCH),
               str(WARM_UP)]
    if valgrind:
        env["PYTHONHASHSEED"] = "0"  # the same dict and set orders every run
        command = ["valgrind", "--tool=cachegrind", "--cache-sim=no",
                   "--cachegrind-out-file=/dev/null", *command]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True,
                          timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"the write path run failed in {tree}:\n{done.stderr[-3000:]}")
    if not valgrind:
        return json.loads(done.stdout.splitlines()[-1])
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if found is None:
        raise SystemExit(f"no instruction count from valgrind in {tree}:\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def instructions(tree: Path, spread: int, batches: int) -> tuple[float, float]:
    """Instructions per batch, and their uncertainty: the median of three runs of
    ``batches`` less the median of three runs of none (the start-up); the uncertainty is
    the two sets' spreads together, per batch."""
    full, none = ([run(tree, spread, n, True) for _ in range(3)] for n in (batches, 0))
    return ((statistics.median(full) - statistics.median(none)) / batches,
            (max(full) - min(full) + max(none) - min(none)) / batches)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="a git revision to compare with (e.g. HEAD~1)")
    parser.add_argument("--partitions", type=int, nargs="+", default=[81, 1],
                        help="partitions a batch of 100 keys spreads over (default 81 1)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="timed runs per tree, alternately (default 3)")
    parser.add_argument("--batches", type=int, default=None,
                        help="batches a run makes after its warm-up (default 400; 200 with "
                             "--instructions)")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per batch under valgrind instead of timing")
    args = parser.parse_args()
    if any(not 1 <= k <= 100 for k in args.partitions):
        parser.error("--partitions are 1..100 (a batch has 100 keys)")
    if args.instructions and shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    batches = args.batches or (200 if args.instructions else 400)
    with compared_trees(args.base) as trees:
        for spread in args.partitions:
            report(trees, spread, batches, args.rounds, args.instructions)
    return 0


def report(trees: dict[str, Path], spread: int, batches: int, rounds: int,
           count: bool) -> None:
    """Print one spread's numbers per tree (and the ratio of the working tree's to the
    base's, when there are two trees)."""
    print(f"a put_all of 100 keys over {spread} partition{'s' if spread > 1 else ''}:",
          flush=True)
    if count:
        counted = {label: instructions(tree, spread, batches) for label, tree in trees.items()}
        for label, (value, spread_of) in counted.items():
            print(f"  {label:>12}: {value:>12,.0f} instructions a batch "
                  f"(± {spread_of:,.0f}: the runs' spread)", flush=True)
        if len(counted) == 2:
            (base, _), (tree, _) = counted.values()
            print(f"  {'ratio':>12}: {tree / base:.3f}")
        return
    best: dict[str, dict] = {}
    for _ in range(rounds):
        for label, tree in trees.items():
            found = run(tree, spread, batches)
            if label not in best or sum(found.values()) < sum(best[label].values()):
                best[label] = found
    for label, found in best.items():
        print(f"  {label:>12}: owners {found['owners']:>7,.0f} µs, backups "
              f"{found['backups']:>7,.0f} µs, acks {found['acks']:>6,.0f} µs, total "
              f"{sum(found.values()):>7,.0f} µs a batch (best {STRETCH} batches of {rounds} runs)")
    if len(best) == 2:
        base, tree = (sum(found.values()) for found in best.values())
        print(f"  {'ratio':>12}: {tree / base:.3f}")


if __name__ == "__main__":
    sys.exit(main())
