"""Network partitions between brokers on one machine, for real: every broker runs under a group id
of its own, and iptables drops the loopback packets a cut broker's processes send to another
broker's port and the ones the other brokers send to its port (the owner match of the OUTPUT
chain). Clients (this process) and the controller quorum keep reaching every broker: the cut
broker keeps its clients and its controller session, and loses its replication links, which is
the partition Jepsen's Kafka runs made (a leader cut off from its followers shrinks its ISR).

The rules live in a chain of their own, jumped to from OUTPUT for loopback only, and are removed
on close (or by `iptables -F/-X` of that chain by hand: its name carries the test's pid)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from functools import cache

from tools.cluster import Cluster


def _iptables(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, timeout=30)


@cache
def split_unavailable() -> str | None:
    """None when iptables' owner match works here, else the reason it does not."""
    if os.geteuid() != 0:
        return f"needs root for iptables (running as uid {os.geteuid()})"
    if shutil.which("iptables") is None:
        return "iptables is not installed (Debian's iptables package; `make system-deps`)"
    chain = f"STRATA-PROBE-{os.getpid()}"
    try:
        made = _iptables("-N", chain)
        if made.returncode != 0:
            return f"iptables cannot make a chain: {made.stderr.strip()}"
        rule = _iptables("-A", chain, "-o", "lo", "-p", "tcp", "-m", "owner", "--gid-owner", "65000", "--dport", "1",
                         "-j", "DROP")
        if rule.returncode != 0:
            return f"iptables has no owner match here: {rule.stderr.strip()}"
    finally:
        _iptables("-F", chain)
        _iptables("-X", chain)
    return None


class BrokerSplit:
    """Give to a Cluster before it starts (brokers then run under their own group ids); cut(b)
    partitions broker b from the other brokers until heal(b)."""

    def __init__(self, c: Cluster) -> None:
        self.cluster = c
        # group ids derived from the brokers' ports: unique among the clusters running at once
        self.gids = {b: 100000 + c.ports[b] for b in c.broker_ids}
        c.groups.update(self.gids)
        self.chain = f"STRATA-SPLIT-{os.getpid()}"[:28]
        self._rules: dict[int, list[list[str]]] = {}
        self._lock = threading.Lock()
        for args in (("-N", self.chain), ("-I", "OUTPUT", "-o", "lo", "-j", self.chain)):
            done = _iptables(*args)
            if done.returncode != 0:
                self.close()
                raise RuntimeError(f"iptables {' '.join(args)}: {done.stderr.strip()}")

    def _rules_for(self, b: int) -> list[list[str]]:
        c = self.cluster
        out = []
        for o in c.broker_ids:
            if o == b:
                continue
            for src, dst in ((b, o), (o, b)):
                out.append(["-o", "lo", "-p", "tcp", "-m", "owner", "--gid-owner", str(self.gids[src]),
                            "--dport", str(c.broker_port(dst)), "-j", "DROP"])
        return out

    def cut(self, b: int) -> None:
        with self._lock:
            if b in self._rules:
                return
            rules = self._rules_for(b)
            for r in rules:
                done = _iptables("-A", self.chain, *r)
                if done.returncode != 0:
                    raise OSError(f"iptables -A {' '.join(r)}: {done.stderr.strip()}")
            self._rules[b] = rules

    def heal(self, b: int) -> None:
        with self._lock:
            for r in self._rules.pop(b, []):
                _iptables("-D", self.chain, *r)

    def close(self) -> None:
        with self._lock:
            self._rules.clear()
        _iptables("-D", "OUTPUT", "-o", "lo", "-j", self.chain)
        _iptables("-F", self.chain)
        _iptables("-X", self.chain)
