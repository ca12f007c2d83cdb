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
