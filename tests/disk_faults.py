"""Real disk faults for log dir tests: a small tmpfs that fills (ENOSPC); ext4 on a loop device
mounted errors=remount-ro, turned read-only by a real filesystem error injected through
/sys/fs/ext4/<dev>/trigger_fs_error (EROFS, as a failing disk does in production); and a FUSE
passthrough filesystem with a fault switch after which its data operations answer EIO (a disk
whose sectors went bad: the kernel hands the broker the error of a real filesystem).

They need root and mount; `unavailable()` (tmpfs, ext4) and `fuse_unavailable()` say why they
cannot run here (tests skip with it). Every mount, loop device and FUSE process is removed on exit,
also when the test failed (lazily if a process still holds files in it)."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
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


@cache
def fuse_unavailable() -> str | None:
    """None when a FUSE passthrough mount works here, else the reason it does not."""
    if os.geteuid() != 0:
        return f"needs root to mount FUSE filesystems (running as uid {os.geteuid()})"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist (no FUSE in this kernel or container)"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian's fuse3 package; `make system-deps`)"
    try:
        import mfusepy  # noqa: F401  (loads libfuse3 through ctypes)
    except (ImportError, OSError) as e:
        return f"mfusepy or libfuse3 unavailable: {e}"
    d = Path(tempfile.mkdtemp(prefix="strata-fuse-probe-"))
    try:
        with fuse_passthrough(d / "backing", d / "mnt") as fs:
            (fs.path / "probe").write_bytes(b"ok")
            if (fs.backing / "probe").read_bytes() != b"ok":
                return "the FUSE passthrough probe did not reach its backing dir"
    except RuntimeError as e:
        return str(e)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return None


def slow_switch_of(switch: Path) -> Path:
    """The slow-disk switch beside a passthrough's EIO switch (the test and the FUSE process
    derive it alike)."""
    return switch.with_suffix(".slow")


class _Passthrough:
    """mfusepy operations mirroring a backing dir. Once the switch file exists, every operation
    that reads, writes or changes the tree answers EIO for good (a dead disk does not heal);
    getattr/statfs keep answering (the kernel serves those from its caches on a real failing disk
    too) and close still frees its descriptor. While the slow file exists, each write and fsync
    first waits the seconds it holds (a slow disk: a dying drive's retries, a saturated array);
    the mount serves calls on several threads, so one slow call does not hold up the others."""

    use_ns = True  # mfusepy: timestamps as integer nanoseconds

    def __init__(self, backing: str, switch: str) -> None:
        self.backing = backing
        self.switch = switch
        self.slow = str(slow_switch_of(Path(switch)))
        self.failed = False

    def _wait_if_slow(self) -> None:
        try:
            with open(self.slow) as f:
                delay = float(f.read() or 0)
        except (OSError, ValueError):
            return
        time.sleep(min(max(delay, 0.0), 30.0))

    def _real(self, path: str) -> str:
        self._check()
        return self.backing + path

    def _check(self) -> None:
        if not self.failed and os.path.exists(self.switch):
            self.failed = True
        if self.failed:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    # metadata: answered also after the fault
    def getattr(self, path: str, fh: int | None = None) -> dict:
        st = os.fstat(fh) if fh is not None else os.lstat(self.backing + path)
        attrs = {k: getattr(st, k) for k in ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size",
                                             "st_blocks", "st_blksize")}
        attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return attrs

    def statfs(self, path: str) -> dict:
        sv = os.statvfs(self.backing + path)
        return {k: getattr(sv, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                                            "f_ffree", "f_favail", "f_namemax")}

    def access(self, path: str, amode: int) -> int:
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    # data and tree: EIO once the switch is on
    def open(self, path: str, flags: int) -> int:
        # the kernel sends the offset of every write (also for O_APPEND): pwrite must not append
        return os.open(self._real(path), flags & ~os.O_APPEND)

    def create(self, path: str, mode: int, flags: int) -> int:
        return os.open(self._real(path), (flags & ~os.O_APPEND) | os.O_CREAT, mode)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self._check()
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self._check()
        self._wait_if_slow()
        return os.pwrite(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        if fh is not None:
            self._check()
            os.ftruncate(fh, length)
        else:
            os.truncate(self._real(path), length)
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self._check()
        self._wait_if_slow()
        (os.fdatasync if datasync else os.fsync)(fh)
        return 0

    def opendir(self, path: str) -> int:
        self._real(path)
        return 0

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._real(path))]

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        fd = os.open(self._real(path), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._real(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._real(path))
        return 0

    def unlink(self, path: str) -> int:
        os.unlink(self._real(path))
        return 0

    def rename(self, old: str, new: str) -> int:
        os.rename(self._real(old), self._real(new))
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._real(path), mode)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        os.utime(self._real(path), ns=times) if times else os.utime(self._real(path))
        return 0


def _serve_passthrough(backing: str, mountpoint: str, switch: str) -> None:
    """The FUSE process's main: serve until unmounted or sent SIGTERM (libfuse then unmounts)."""
    import ctypes

    import mfusepy

    # die with the test process even when it is killed -9: SIGTERM lets libfuse unmount
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    # allow_other: a broker may run under another group id (tests/faults/split.py), and without it
    # FUSE lets in only processes whose user and group ids all match the mounting process's
    mfusepy.FUSE(_Passthrough(backing, switch), mountpoint, foreground=True, fsname="strata-eio", allow_other=True)


@dataclass
class FusePassthrough:
    path: Path  # the mount point: give it to the broker as a log dir
    backing: Path  # where the files really are
    switch: Path  # exists -> every data operation answers EIO

    def fail(self) -> None:
        """Flip the fault switch: from now on the filesystem answers EIO (there is no way back)."""
        self.switch.touch()

    @property
    def slow_switch(self) -> Path:
        return slow_switch_of(self.switch)

    def slow_down(self, delay: float) -> None:
        """From now on every write and fsync first waits `delay` seconds, until speed_up()."""
        tmp = self.slow_switch.with_suffix(".tmp")
        tmp.write_text(f"{delay}")
        tmp.replace(self.slow_switch)

    def speed_up(self) -> None:
        self.slow_switch.unlink(missing_ok=True)


def _fuse_mounted(path: Path) -> bool:
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[1] == str(path) and parts[2].startswith("fuse"):
            return True
    return False


@contextmanager
def fuse_passthrough(backing: Path, path: Path) -> Iterator[FusePassthrough]:
    """Mount `backing` at `path` through a FUSE passthrough served by a separate process (it keeps
    answering while this process blocks in a call into the mount). Always unmounted and its process
    stopped on exit."""
    backing.mkdir(parents=True, exist_ok=True)
    path.mkdir(parents=True, exist_ok=True)
    switch = backing.with_name(backing.name + ".eio")
    switch.unlink(missing_ok=True)
    slow_switch_of(switch).unlink(missing_ok=True)
    log = backing.with_name(backing.name + ".fuse.log")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent.parent),
                                                      env.get("PYTHONPATH")]))
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tests.disk_faults", "passthrough", str(backing), str(path),
                                 str(switch)], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 15
        while not _fuse_mounted(path):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"FUSE passthrough did not mount on {path}: "
                                   f"{log.read_text(errors='replace').strip()[-500:] or 'no output'}")
            time.sleep(0.05)
        yield FusePassthrough(path, backing, switch)
    finally:
        if _fuse_mounted(path) and _run("fusermount3", "-u", str(path)).returncode != 0:
            _run("fusermount3", "-u", "-z", str(path))  # a process still holds files there: detach it now
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


if __name__ == "__main__" and sys.argv[1:2] == ["passthrough"]:
    _serve_passthrough(*sys.argv[2:5])
