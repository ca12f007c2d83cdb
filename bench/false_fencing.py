"""No false fencing: a broker paused (SIGSTOP) for 20 s at a time, in turn, for N minutes, under an
idempotent acks=all producer, while the controller's closed-connection fencing (README, "Broker
failure detection") and the session timeout run. A paused broker keeps its connections open, so
it is fenced when its session runs out, as Kafka does; any other fence (a broker not paused, or
one fenced outside its pause) is false. Also counts the producer's acknowledgements and errors.

    .venv/bin/python bench/false_fencing.py [--minutes 10] [--pause 20] [--gap 20]

Prints one line per pause and a summary table; exits 1 on a false fence or a lost acknowledgement.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from tests.faults.workload import QUIET  # noqa: E402
from tools.cluster import Cluster  # noqa: E402

TOPIC = "fencing"
FENCED = re.compile(r"timestamp='([^']+)'.*event='broker_fenced' broker=(\d+)")
GRACE_S = 3.0  # a fence this long after a pause ends still counts as the pause's (the record's way out)


def fences(c: Cluster) -> list[tuple[float, int]]:
    """(wall time, broker) of every broker_fenced line in the controllers' logs."""
    out = []
    for cid in c.controller_ids:
        for m in FENCED.finditer(c.log_path(cid).read_text(errors="replace")):
            out.append((datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp(), int(m.group(2))))
    return sorted(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--pause", type=float, default=20.0, help="seconds each pause lasts")
    ap.add_argument("--gap", type=float, default=20.0, help="seconds between pauses")
    a = ap.parse_args()
    if a.minutes <= 0 or a.pause <= 0 or a.gap <= 0:
        ap.error("--minutes, --pause and --gap must be positive")
    acked, errors = [0], [0]
    lock = threading.Lock()
    stop = threading.Event()
    pauses: list[tuple[float, float, int]] = []  # (start, end) wall times, broker
    with tempfile.TemporaryDirectory(prefix="strata-fencing-") as tmp:
        c = Cluster(Path(tmp) / "c", brokers=3, verbose=False)
        try:
            c.start(timeout=120)
            admin = AdminClient({"bootstrap.servers": c.bootstrap, **QUIET})
            admin.create_topics([NewTopic(TOPIC, 3, 3, config={"min.insync.replicas": "2"})])[TOPIC].result(60)

            def produce() -> None:
                p = Producer({"bootstrap.servers": c.bootstrap, "enable.idempotence": True, "acks": "all",
                              "linger.ms": 5, "message.timeout.ms": 120000, **QUIET})

                def done(err, _msg) -> None:
                    with lock:
                        if err is None:
                            acked[0] += 1
                        else:
                            errors[0] += 1

                while not stop.is_set():
                    try:
                        p.produce(TOPIC, b"x" * 100, on_delivery=done)
                    except BufferError:
                        pass
                    p.poll(0.005)
                p.flush(120)

            writer = threading.Thread(target=produce, daemon=True)
            writer.start()
            deadline = time.monotonic() + a.minutes * 60
            turn = 0
            while time.monotonic() + a.gap + a.pause < deadline:
                time.sleep(a.gap)
                broker = c.broker_ids[turn % len(c.broker_ids)]
                turn += 1
                pid = c.pid(broker)
                if pid is None:
                    continue
                start = time.time()
                os.kill(pid, signal.SIGSTOP)
                try:
                    time.sleep(a.pause)
                finally:
                    os.kill(pid, signal.SIGCONT)
                pauses.append((start, time.time(), broker))
                print(f"paused broker {broker} for {a.pause:.0f}s", flush=True)
            time.sleep(a.gap)
            stop.set()
            writer.join(180)
            seen = fences(c)
        finally:
            stop.set()
            c.stop()
    expected = [f for f in seen if any(b == f[1] and s <= f[0] <= e + GRACE_S for s, e, b in pauses)]
    false = [f for f in seen if f not in expected]
    print(f"\n{'pauses':>7} {'fences of paused':>17} {'false fences':>13} {'acknowledged':>13} {'errors':>7}")
    print(f"{len(pauses):>7} {len(expected):>17} {len(false):>13} {acked[0]:>13} {errors[0]:>7}")
    for t, b in false:
        print(f"false fence: broker {b} at {datetime.fromtimestamp(t).isoformat()}")
    return 1 if false or errors[0] else 0


if __name__ == "__main__":
    sys.exit(main())
