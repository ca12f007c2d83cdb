"""The history checker: what a run of the workload saw, judged as Jepsen judged Kafka's queues.

A history is what the producer was told (each acknowledged value with its partition and offset),
what it attempted, what consumers read while faults ran, and a final read of every partition
from its start once the faults are healed. Anomalies:
- lost: an acknowledged value missing from the final read;
- duplicated: a value at more than one offset;
- inconsistent: two values seen at one offset (an acknowledgement, a read during the run and the
  final read must agree: a leader that acknowledged or served data a later leader replaced);
- nonmonotonic: a consumer's offsets in a partition not increasing;
- reordered: one producer's values out of send order within a partition (an idempotent
  producer's batches keep their order);
- phantom: a value read that was never sent;
- aborted_read (Adya's G1a): a value of an aborted transaction read by a read_committed consumer;
- non_atomic: a transaction partly visible (some of its values read, others not), whatever its
  outcome; a committed transaction's missing values also count as lost;
- G0 (write cycle) and G1c (circular information flow), Adya's, as Jepsen's Kafka checker infers
  them: transaction T1 precedes T2 (ww) when T2's value follows T1's next in a partition's final
  order, and (wr) when T2 read, inside its transaction, a value T1 wrote. A cycle of ww edges alone
  is G0; one that needs a wr edge is G1c. Kafka puts no order between concurrent transactions
  writing the same partitions (a write cycle between them is allowed by its design), so the
  workload's transactional producers write disjoint partitions: any cycle then means a reader saw
  uncommitted data or a producer's transactions landed out of their commit order.
Values are `<producer>:<sequence>` strings, so order and origin are known from the value alone.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from tests.graphs import cycles

Read = tuple[int, int, str]  # (partition, offset, value)


@dataclass
class History:
    attempted: set[str] = field(default_factory=set)
    acked: dict[str, tuple[int, int | None]] = field(default_factory=dict)  # value -> (partition, offset or None)
    reads: list[list[Read]] = field(default_factory=list)  # each consumer's reads, in order
    final: list[Read] = field(default_factory=list)  # every partition from its start, after healing
    # transactions: (values, outcome), outcome "committed", "aborted" or "unknown" (the call failed)
    txns: list[tuple[list[str], str]] = field(default_factory=list)
    txn_reads: dict[int, list[str]] = field(default_factory=dict)  # index in txns -> values it read


def _seq(value: str) -> tuple[str, int] | None:
    producer, _, n = value.rpartition(":")
    return (producer, int(n)) if n.isdigit() else None  # not the workload's: a phantom


def check(h: History) -> dict[str, list]:
    """Anomalies by kind (empty lists when the history is valid)."""
    out: dict[str, list] = {k: [] for k in ("lost", "duplicated", "inconsistent", "nonmonotonic", "reordered",
                                            "phantom", "aborted_read", "non_atomic", "G0", "G1c")}
    at: dict[tuple[int, int], str] = {}
    where: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for p, off, v in h.final:
        if (p, off) in at and at[(p, off)] != v:
            out["inconsistent"].append(("final", p, off, at[(p, off)], v))
        at[(p, off)] = v
        where[v].append((p, off))
    for v, places in where.items():
        if len(places) > 1:
            out["duplicated"].append((v, sorted(places)))
        if v not in h.attempted:
            out["phantom"].append((v, places[0]))
    for v, (p, off) in h.acked.items():
        if v not in where:
            out["lost"].append((v, p, off))
        elif off is None:
            # acknowledged without an offset: librdkafka reports a batch whose answer was lost as
            # delivered once a later batch of its producer succeeds, which proves it written
            if all(pp != p for pp, _ in where[v]):
                out["inconsistent"].append(("acked", p, off, v, where[v]))
        elif at.get((p, off)) != v:
            out["inconsistent"].append(("acked", p, off, v, at.get((p, off))))
    for i, reads in enumerate(h.reads):
        last: dict[int, int] = {}
        for p, off, v in reads:
            if off <= last.get(p, -1):
                out["nonmonotonic"].append((i, p, last[p], off))
            last[p] = off
            if (p, off) in at and at[(p, off)] != v:
                out["inconsistent"].append((f"consumer {i}", p, off, v, at[(p, off)]))
            if v not in h.attempted:
                out["phantom"].append((v, (p, off)))
    seen = set(where)
    for reads in h.reads:
        seen.update(v for _, _, v in reads)
    for values, outcome in h.txns:
        visible = [v for v in values if v in where]
        if outcome == "aborted":
            out["aborted_read"].extend(v for v in values if v in seen)
        elif outcome == "committed":
            out["lost"].extend((v, -1, -1) for v in values if v not in where)
        if visible and len(visible) != len(values):
            out["non_atomic"].append((outcome, values, visible))
    for kind, cycle in _cycles(h):
        out[kind].append(cycle)
    newest: dict[tuple[int, str], tuple[int, int]] = {}  # (partition, producer) -> (sequence, offset)
    for p, off, v in sorted(h.final):
        seq = _seq(v)
        if seq is None:
            continue
        producer, n = seq
        prev = newest.get((p, producer))
        if prev is not None and n < prev[0]:
            out["reordered"].append((p, producer, prev, (n, off)))
        newest[(p, producer)] = (n, off)
    return out


def _cycles(h: History) -> list[tuple[str, list[int]]]:
    """The dependency graph's cycles, one per strongly connected component of more than one
    transaction: ("G0", its transactions) when its ww edges alone close a cycle, else ("G1c", ...)."""
    writer = {v: i for i, (values, outcome) in enumerate(h.txns) if outcome != "aborted" for v in values}
    ww: dict[int, set[int]] = defaultdict(set)
    last: dict[int, int] = {}  # partition -> the transaction that wrote its newest value so far
    for p, _, v in sorted(h.final):
        t = writer.get(v)
        if t is None:
            continue
        if p in last and last[p] != t:
            ww[last[p]].add(t)
        last[p] = t
    edges: dict[int, set[int]] = defaultdict(set, {t: set(n) for t, n in ww.items()})
    for j, read in h.txn_reads.items():
        for v in read:
            i = writer.get(v)
            if i is not None and i != j:
                edges[i].add(j)
    out = []
    for comp in cycles(edges):
        inside = set(comp)
        only_ww = {t: ww.get(t, set()) & inside for t in comp}
        out.append(("G0" if cycles(only_ww) else "G1c", comp))
    return out


def anomalies(result: dict[str, list]) -> int:
    return sum(len(v) for v in result.values())


def summary(result: dict[str, list], limit: int = 5) -> str:
    """One line per kind found, with its first few cases."""
    lines = [f"{k}: {len(v)} e.g. {v[:limit]}" for k, v in result.items() if v]
    return "\n".join(lines) or "no anomalies"
