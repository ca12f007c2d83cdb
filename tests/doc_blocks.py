"""Docs pages whose ```sh blocks tests run word for word (the compose quickstart, the operations
procedures): finding a block by the marker line above it, and running one of its lines in bash
with the environment the lines before it exported."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path


def sh_block(page: Path, marker: str) -> list[str]:
    """The lines of the ```sh block right after `marker` in `page`."""
    m = re.search(re.escape(marker) + r"\n```sh\n(.*?)\n```", page.read_text(), re.S)
    assert m, f"{page}: no ```sh block after {marker}"
    return m.group(1).splitlines()


def run_line(line: str, shown: str, *, cwd: Path, env: dict[str, str], env_file: Path,
             timeout: float) -> tuple[str, dict[str, str]]:
    """Runs `line` in bash; returns its output and the environment after it (an `export` line
    changes it). `shown` is how the line is printed (the page's own words)."""
    script = f'{line}\nrc=$?\nenv -0 > "{env_file}"\nexit $rc\n'
    started = time.monotonic()
    out = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    print(f"$ {shown}  ({time.monotonic() - started:.1f} s)\n{out.stdout}{out.stderr}", flush=True)
    assert out.returncode == 0, f"{shown!r} exited {out.returncode}: {out.stderr.strip()[-2000:]}"
    if shown.startswith("export "):
        pairs = (item.split("=", 1) for item in env_file.read_text().split("\0") if "=" in item)
        env = dict(pairs)
    return out.stdout, env
