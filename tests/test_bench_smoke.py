"""bench/produce_consume.py still runs: a quick Strata-only pass prints a table row per workload.

Asserts nothing about speed; only that the bench has not rotted (imports, cluster launch, clients).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ROW = r"^strata\s+confluent {what}.*?\s(\d[\d,]*)\s+\d[\d,]*-\d[\d,]*\s+\d+\.\d\s"


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_bench_quick_strata_only() -> None:
    r = subprocess.run(
        [sys.executable, str(REPO / "bench" / "produce_consume.py"), "--quick", "--strata-only"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=75,
        stdin=subprocess.DEVNULL,
    )
    report = f"exit {r.returncode}\n--- stdout\n{r.stdout}\n--- stderr (tail)\n{r.stderr[-3000:]}"
    assert r.returncode == 0, report
    for what in ("produce", "consume"):
        m = re.search(ROW.format(what=what), r.stdout, re.M)
        assert m, f"no strata {what} row with numbers\n{report}"
        assert int(m.group(1).replace(",", "")) > 0, report


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_log_dirs_quick() -> None:
    """bench/log_dirs.py still runs: a 20 MB move beside cp, produce with and without a move."""
    r = subprocess.run(
        [sys.executable, str(REPO / "bench" / "log_dirs.py"), "--quick"],
        cwd=REPO, capture_output=True, text=True, timeout=100, stdin=subprocess.DEVNULL,
    )
    report = f"exit {r.returncode}\n--- stdout\n{r.stdout}\n--- stderr (tail)\n{r.stderr[-3000:]}"
    assert r.returncode == 0, report
    assert re.search(r"^AlterReplicaLogDirs move\s+\d+\.\d\s+\d+\.\d\d\s+\d", r.stdout, re.M), report
    assert re.search(r"^while a move runs\s+[\d,]+\s", r.stdout, re.M), report
