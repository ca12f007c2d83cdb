"""Real disk faults for log dir tests: a small tmpfs that fills (ENOSPC) and ext4 on a loop device
mounted errors=remount-ro, turned read-only by a real filesystem error injected through
/sys/fs/ext4/<dev>/trigger_fs_error (EROFS, as a failing disk does in production).

Both need root and mount; `unavailable()` says why they cannot run here (tests skip with it).
Every mount and loop device is removed on exit, also when the test failed (lazily if a process
still holds files in it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


@cache
def unavailable() -> str | None:
    """None when tmpfs and ext4-on-loop mounts work here, else the reason they do not."""
    if os.geteuid() != 0:
        return f"needs root to mount filesystems (running as uid {os.geteuid()})"
    for tool in ("mount", "umount", "losetup", "mkfs.ext4"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    d = tempfile.mkdtemp(prefix="strata-mount-probe-")
    try:
        r = _run("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", d)
        if r.returncode != 0:
            return f"cannot mount a tmpfs: {r.stderr.strip()}"
        _run("umount", d)
        try:
            with ext4_loop(Path(d) / "m", 8 << 20):
                pass
        except RuntimeError as e:
            return str(e)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return None


def _umount(path: Path) -> None:
    if _run("umount", str(path)).returncode != 0:
        _run("umount", "-l", str(path))  # a process still holds files there: detach it now


@contextmanager
def tmpfs(path: Path, size_bytes: int) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    r = _run("mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path))
    if r.returncode != 0:
        raise RuntimeError(f"mount tmpfs on {path}: {r.stderr.strip()}")
    try:
        yield path
    finally:
        _umount(path)


@dataclass
class Ext4:
    path: Path
    device: str  # /dev/loopN

    def trigger_error(self) -> None:
        """A real ext4 error: the kernel remounts the filesystem read-only under its users."""
        Path(f"/sys/fs/ext4/{Path(self.device).name}/trigger_fs_error").write_text("1")

    def is_read_only(self) -> bool:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 3 and parts[1] == str(self.path):
                return "ro" in parts[3].split(",") or "emergency_ro" in parts[3]
        return False


@contextmanager
def ext4_loop(path: Path, size_bytes: int) -> Iterator[Ext4]:
    path.mkdir(parents=True, exist_ok=True)
    image = path.with_name(path.name + ".img")
    device = None
    mounted = False
    try:
        with open(image, "wb") as f:
            f.truncate(size_bytes)
        r = _run("mkfs.ext4", "-q", "-F", str(image))
        if r.returncode != 0:
            raise RuntimeError(f"mkfs.ext4: {r.stderr.strip()}")
        r = _run("losetup", "-f", "--show", str(image))
        if r.returncode != 0:
            raise RuntimeError(f"losetup: {r.stderr.strip()}")
        device = r.stdout.strip()
        r = _run("mount", "-t", "ext4", "-o", "errors=remount-ro", device, str(path))
        if r.returncode != 0:
            raise RuntimeError(f"mount {device}: {r.stderr.strip()}")
        mounted = True
        yield Ext4(path, device)
    finally:
        if mounted:
            _umount(path)
        if device is not None:
            _run("losetup", "-d", device)
        image.unlink(missing_ok=True)
