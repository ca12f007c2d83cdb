"""Wall-clock jumps of one broker process: its wall clock moved by a number of seconds written to
a file, which an LD_PRELOAD library of our own (clock_shift.c, built here with the system's C
compiler) reads as the process runs. Monotonic clocks stay as they are, as with an NTP step."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import time
from functools import cache
from pathlib import Path

from tools.cluster import Cluster

SOURCE = Path(__file__).with_name("clock_shift.c")


def _build(out_dir: Path) -> Path:
    """The library, compiled once per source version into out_dir."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    lib = out_dir / f"clock_shift-{digest}.so"
    if not lib.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = lib.with_suffix(".tmp")
        done = subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(tmp), str(SOURCE), "-ldl"],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"cc failed building {SOURCE.name}: {done.stderr.strip()[-500:]}")
        tmp.replace(lib)
    return lib


@cache
def clock_unavailable() -> str | None:
    """None when the library builds and moves a process's clock here, else why not."""
    if shutil.which("cc") is None:
        return "no C compiler (cc) to build the clock-shift library (Debian's gcc; the connector needs it too)"
    with tempfile.TemporaryDirectory(prefix="strata-clock-probe-") as d:
        try:
            lib = _build(Path(d))
        except RuntimeError as e:
            return str(e)
        shift = Path(d) / "shift"
        shift.write_text("3600")
        probe = subprocess.run(["python3", "-c", "import time; a = time.time(); time.sleep(0.01); print(a)"],
                               env={"LD_PRELOAD": str(lib), "STRATA_CLOCK_SHIFT_FILE": str(shift), "PATH": "/usr/bin:/bin"},
                               capture_output=True, text=True, timeout=30)
        if probe.returncode != 0 or abs(float(probe.stdout or 0) - time.time() - 3600) > 60:
            return f"the clock-shift library did not move a process's clock: {probe.stderr.strip()[-300:]}"
    return None


class ClockShifts:
    """Give to a Cluster before it starts: every broker then runs with the library preloaded and a
    shift file of its own; jump(b, seconds) sets broker b's wall clock that far from the real one."""

    def __init__(self, c: Cluster, work: Path) -> None:
        lib = _build(work)
        self.files = {b: work / f"clock-shift-{b}" for b in c.broker_ids}
        for b, f in self.files.items():
            f.write_text("0")
            c.node_env.setdefault(b, {}).update({"LD_PRELOAD": str(lib), "STRATA_CLOCK_SHIFT_FILE": str(f)})

    def jump(self, b: int, seconds: float) -> None:
        f = self.files[b]
        tmp = f.with_suffix(".tmp")
        tmp.write_text(f"{seconds}")
        tmp.replace(f)  # the library never reads half a number

    def reset(self, b: int) -> None:
        self.jump(b, 0.0)
