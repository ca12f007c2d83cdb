"""The docker plumbing of `make compose-test`: the engine, Compose, and the image to build on.

    python -m tools.docker_base      # prints the BASE_IMAGE to build the Dockerfile on

- `ensure_packages()`: Debian's docker.io and docker-compose (Compose v1), installed with apt-get
  when missing (as root only).
- `Dockerd`: uses the engine that answers, else starts `dockerd` and stops it again at the end.
- `base_image()`: python:3.11-slim when the engine has it or can pull it; else an equivalent
  built from Debian's archive: `debootstrap` bookworm (Python 3.11, its venv module and pip
  wheel), imported as strata-base:bookworm. The root filesystem is kept as a tarball under
  CACHE_DIR, so another run (or an engine whose images were wiped) imports it again without
  running debootstrap.

Every failure is a DockerUnavailable with one line saying what is missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

REGISTRY_BASE = "python:3.11-slim"
LOCAL_BASE = "strata-base:bookworm"
SUITE = "bookworm"  # Debian 12: python3 is 3.11, as the registry image
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv", "ca-certificates")
CACHE_DIR = Path(os.environ.get("STRATA_DOCKER_CACHE", "/var/cache/strata-docker"))
# The host's trust store: where the archive and PyPI are reached through a TLS proxy, its CA is
# in there and not in Debian's ca-certificates.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


class DockerUnavailable(RuntimeError):
    """The engine, Compose or the base image cannot be had here (the message says why)."""


def run(cmd: list[str], *, timeout: float = 600, stdin: IO[bytes] | None = None) -> None:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=stdin)
    if out.returncode != 0:
        tail = (out.stderr or out.stdout or "").strip().splitlines()[-1:]
        raise DockerUnavailable(f"{' '.join(cmd[:3])} failed (exit {out.returncode}){': ' + tail[0] if tail else ''}")


def is_root() -> bool:
    return os.geteuid() == 0


def apt_install(packages: list[str]) -> None:
    if not (is_root() and shutil.which("apt-get")):
        raise DockerUnavailable(f"{', '.join(packages)} missing: install Debian's packages of that name (as root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]):
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if out.returncode != 0:
            last = (out.stderr or out.stdout).strip().splitlines()[-1:]
            raise DockerUnavailable(f"{' '.join(cmd[:3])} {' '.join(packages)} failed: {last[0] if last else out.returncode}")


def compose_plugin_works() -> bool:
    return bool(shutil.which("docker")) and subprocess.run(["docker", "compose", "version"],
                                                            capture_output=True).returncode == 0


def compose_command() -> list[str]:
    """`docker compose` (the v2 plugin) where the CLI has it, else Debian's `docker-compose`
    (v1.29): the quickstart's compose commands run with either, the arguments are the same."""
    if compose_plugin_works():
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise DockerUnavailable("neither `docker compose` nor `docker-compose` is installed")


def ensure_packages() -> None:
    """The docker CLI, an engine (dockerd, unless one already answers) and a Compose."""
    missing = []
    if not shutil.which("docker") or not (shutil.which("dockerd") or engine_answers()):
        missing.append("docker.io")
    if not (shutil.which("docker-compose") or compose_plugin_works()):
        missing.append("docker-compose")
    if missing:
        apt_install(missing)


def engine_answers() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class Dockerd:
    """The docker engine for a test: the running one, or a `dockerd` started here (its log under
    `log_dir`) and stopped by stop()."""

    def __init__(self, log_dir: Path) -> None:
        self.log_path = log_dir / "dockerd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> None:
        if engine_answers():
            return
        if not is_root():
            raise DockerUnavailable("no docker engine answers and dockerd needs root to start")
        if not shutil.which("dockerd"):
            raise DockerUnavailable("dockerd is not installed")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if engine_answers():
                return
            time.sleep(0.5)
        self.stop()
        lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if "level=fatal" in ln
                 or "level=error" in ln]
        raise DockerUnavailable(f"dockerd did not start: {lines[-1] if lines else 'see ' + str(self.log_path)}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def image_present(name: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", name], capture_output=True).returncode == 0


def base_tarball() -> Path:
    return CACHE_DIR / f"{SUITE}-python3.tar"


def debootstrap_tarball(tarball: Path) -> None:
    """A minimal Debian root filesystem with Python 3.11 and its venv module, as a tarball."""
    if not shutil.which("debootstrap"):
        apt_install(["debootstrap"])
    tarball.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tarball.parent, prefix="rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(root), MIRROR],
            timeout=1800)
        if HOST_CA_BUNDLE.is_file():
            shutil.copyfile(HOST_CA_BUNDLE, root / "etc/ssl/certs/ca-certificates.crt")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (root / junk).glob("*"):
                if p.is_file():
                    p.unlink()
        partial = tarball.with_suffix(".partial")
        run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."], timeout=600)
        partial.replace(tarball)


def build_local_base() -> str:
    tarball = base_tarball()
    if not tarball.is_file():
        print(f"docker_base: debootstrap {SUITE} into {tarball}", file=sys.stderr)
        debootstrap_tarball(tarball)
    with open(tarball, "rb") as f:
        run(["docker", "import", "--change", "ENV LANG=C.UTF-8", "--change", 'CMD ["python3"]', "-", LOCAL_BASE],
            stdin=f)
    return LOCAL_BASE


def base_image() -> str:
    """The BASE_IMAGE the Dockerfile builds on here (see the module's doc)."""
    if image_present(REGISTRY_BASE):
        return REGISTRY_BASE
    if subprocess.run(["docker", "pull", REGISTRY_BASE], capture_output=True, timeout=600).returncode == 0:
        return REGISTRY_BASE
    if image_present(LOCAL_BASE):
        return LOCAL_BASE
    return build_local_base()


def main() -> int:
    try:
        if not engine_answers():
            raise DockerUnavailable("no docker engine answers (start dockerd, or run `make compose-test`)")
        print(base_image())
    except (DockerUnavailable, subprocess.TimeoutExpired) as e:
        print(f"docker_base: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
