"""Benchmark put, get, put_all and get_all against a running cluster (`shmgrid start`).

    python tools/bench_ops.py --keys 20000 --value-size 100 --seconds 3
"""

import argparse
import sys

from grid.bench import add_arguments, run_bench

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster-name", help="cluster to use (default dev)")
    add_arguments(parser)
    sys.exit(run_bench(parser.parse_args()))
