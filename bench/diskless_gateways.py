"""Produce gateways (KIP-1164's "Reducing multi-DC commit operations"), measured in one run: 6 brokers
in 3 racks, 2 diskless coordinators (`__diskless_metadata` with 2 partitions), 2 confluent-kafka
producers per rack naming their rack (`client.rack` and `diskless_az=<rack>` in client.id), all
writing keyed messages over the 8 partitions of one diskless topic. First without gateways
(`diskless.produce.gateways.enable=false`, a dynamic cluster-wide config: a producer writes every
partition through one broker of its rack), then with them, in the same cluster. Per WAL file:
commit requests (one per coordinator broker asked; the broker's own coordinator is a call) and the
remote ones (over the network), read from the brokers' `diskless_file_committed` events.

    .venv/bin/python bench/diskless_gateways.py                # about half a minute
    .venv/bin/python bench/diskless_gateways.py --messages 500 # smoke check
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_diskless_gateways import RACKS, measure, metadata_view, start_cluster  # noqa: E402


def row(name: str, files: list[tuple[int, int, int]]) -> str:
    reqs = [n for _, n, _ in files]
    remote = [r for _, _, r in files]
    n = max(len(files), 1)
    return (f"| {name} | {len(files)} | {sum(reqs) / n:.2f} | {max(reqs, default=0)} | {sum(remote) / n:.2f} | "
            f"{max(remote, default=0)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=10_000, help="per producer and phase")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-gateways-") as tmp:
        c = start_cluster(Path(tmp) / "cluster")
        try:
            without = measure(c, False, args.messages)
            with_gw = measure(c, True, args.messages)
            _, coordinators, racks = metadata_view(c, 1, "bench-diskless_az=r1")
        finally:
            c.stop()
    print(f"brokers {len(RACKS)} in racks {sorted(set(RACKS.values()))}; coordinator leaders "
          f"{ {i: (b, racks.get(b)) for i, b in sorted(coordinators.items())} }")
    print("| produce routing | WAL files | commit requests / file | max | remote / file | max remote |")
    print("|---|---|---|---|---|---|")
    print(row("without gateways", without))
    print(row("with gateways", with_gw))


if __name__ == "__main__":
    main()
