"""docker-compose.yml, Dockerfile and docker/*/server.properties agree with the launcher.

A quick check without an engine (tests/test_compose.py builds the image and runs the cluster):
this parses the compose file and checks each service against tools.cluster.docker_configs(), the
generator `make run` uses too: same configs, two log-dir volumes per broker at its log.dirs, host
names and ports matching listeners and voters.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from node.config import load_properties, parse_listeners, parse_voters
from tests.test_compose import STEPS, quickstart_block
from tools.cluster import CONTROLLER, CONTROLLER_ID, DOCKER_CONFIG_PATH, DOCKER_INTERNAL_PORT, docker_configs

ROOT = Path(__file__).resolve().parent.parent
EXPECTED = docker_configs()


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def mounts(service: dict) -> dict[str, str]:
    """target -> source of a service's short-syntax volumes (a trailing :ro/:rw dropped)."""
    out = {}
    for v in service.get("volumes", []):
        parts = v.split(":")
        if parts[-1] in ("ro", "rw"):
            parts = parts[:-1]
        source, target = parts
        out[target] = source
    return out


def test_services(compose: dict) -> None:
    default = {n for n, s in compose["services"].items() if not s.get("profiles")}
    assert default == set(EXPECTED) == {"controller", "controller-101", "controller-102", "broker-1", "broker-2",
                                        "broker-3"}


def test_metrics_profile_scrapes_every_node(compose: dict) -> None:
    """`docker compose --profile metrics` adds Prometheus, scraping each node's metrics.listener."""
    prom = compose["services"]["prometheus"]
    assert prom["profiles"] == ["metrics"]
    assert prom["build"]["context"] == "docker/prometheus" and (ROOT / "docker/prometheus/Dockerfile").is_file()
    assert prom["ports"] == ["127.0.0.1:9090:9090"]
    source = mounts(prom)["/etc/prometheus/prometheus.yml"]
    config = yaml.safe_load((ROOT / source).read_text())
    [job] = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    [static] = job["static_configs"]
    wanted = set()
    for name, props in EXPECTED.items():
        m = re.fullmatch(r"http://0\.0\.0\.0:(\d+)", props["metrics.listener"])
        assert m, f"{name}: metrics.listener should listen on all interfaces of its container"
        wanted.add(f"{name}:{m.group(1)}")
    assert set(static["targets"]) == wanted
    assert set(prom.get("depends_on") or []) == set(EXPECTED)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_service_runs_its_generated_config(compose: dict, name: str) -> None:
    svc = compose["services"][name]
    props = EXPECTED[name]
    role = props["process.roles"]
    assert svc["command"] == ["python", "-m", role, "--config", DOCKER_CONFIG_PATH]
    assert svc["build"] == {"context": ".", "args": {"BASE_IMAGE": "${STRATA_BASE_IMAGE:-python:3.11-slim}"}}
    assert svc.get("image")
    assert svc.get("hostname", name) == name

    source = mounts(svc).get(DOCKER_CONFIG_PATH)
    assert source == f"./docker/{name}/server.properties"
    assert load_properties(ROOT / source) == props, "regenerate: python -m tools.devcluster --emit-docker docker/"


@pytest.mark.parametrize("name", list(EXPECTED))
def test_log_dirs_are_volumes(compose: dict, name: str) -> None:
    svc = compose["services"][name]
    dirs = EXPECTED[name]["log.dirs"].split(",")
    assert len(dirs) == (1 if name.startswith(CONTROLLER) else 2)
    m = mounts(svc)
    volumes = [m.get(d) for d in dirs]
    assert all(volumes), f"{name}: every log dir {dirs} needs a volume, has {m}"
    # named volumes (declared at top level), one per dir, none shared with another service
    assert all(v in (compose.get("volumes") or {}) for v in volumes), volumes
    assert len(set(volumes)) == len(volumes)
    others = {src for n, s in compose["services"].items() if n != name for src in mounts(s).values()}
    assert not set(volumes) & others


def test_ports_hosts_and_voters(compose: dict) -> None:
    services = compose["services"]
    ctl = EXPECTED[CONTROLLER]
    controllers = {CONTROLLER_ID + k: CONTROLLER if k == 0 else f"{CONTROLLER}-{CONTROLLER_ID + k}" for k in range(3)}
    voters = {}
    for cid, name in controllers.items():
        props = EXPECTED[name]
        [cl] = parse_listeners(props["listeners"])
        assert cl.listener in props["controller.listener.names"].split(",")
        assert int(props["node.id"]) == cid
        assert str(cl.port) in [str(p) for p in services[name].get("expose", [])]
        assert props["controller.quorum.voters"] == ctl["controller.quorum.voters"]
        # the voters of one quorum format their metadata dirs with one cluster id
        assert props["cluster.id"] == ctl["cluster.id"]
        voters[cid] = (name, cl.port)
    assert parse_voters(ctl["controller.quorum.voters"]) == voters

    seen_ports = {port for _, port in voters.values()}
    for i in (1, 2, 3):
        name = f"broker-{i}"
        props = EXPECTED[name]
        assert int(props["node.id"]) == i
        assert props["controller.quorum.voters"] == ctl["controller.quorum.voters"]
        listen = {e.listener: e for e in parse_listeners(props["listeners"])}
        adv = {e.listener: e for e in parse_listeners(props["advertised.listeners"], "advertised.listeners")}
        assert set(listen) == set(adv) == {"PLAINTEXT", "EXTERNAL"}
        assert all(e.host == "0.0.0.0" for e in listen.values())
        # inside: the service name on the compose network, what the peers dial
        assert props["inter.broker.listener.name"] == "PLAINTEXT"
        assert (adv["PLAINTEXT"].host, adv["PLAINTEXT"].port) == (name, listen["PLAINTEXT"].port)
        assert listen["PLAINTEXT"].port == DOCKER_INTERNAL_PORT
        assert str(DOCKER_INTERNAL_PORT) in [str(p) for p in services[name].get("expose", [])]
        # outside: published 1:1 on the host's loopback only, advertised as that address
        ext = adv["EXTERNAL"]
        assert (ext.host, ext.port) == ("127.0.0.1", listen["EXTERNAL"].port)
        assert services[name]["ports"] == [f"127.0.0.1:{ext.port}:{ext.port}"]
        assert set(controllers.values()) <= set(services[name].get("depends_on") or [])
        assert ext.port not in seen_ports
        seen_ports.add(ext.port)


def test_committed_configs_are_what_the_generator_writes(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "tools.devcluster", "--emit-docker", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    # docker/prometheus/Dockerfile is hand-written (the metrics profile's image)
    committed = sorted(p.relative_to(ROOT / "docker") for p in (ROOT / "docker").rglob("*")
                       if p.is_file() and p.name != "Dockerfile")
    assert generated == committed
    for rel in generated:
        assert (tmp_path / rel).read_text() == (ROOT / "docker" / rel).read_text(), rel


def test_dockerfile_installs_every_package() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim$", text, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M)
    assert re.search(r"pip install \.", text)
    copied = set(re.findall(r"^COPY\s+(\S+)\s", text, re.M))
    includes = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in includes}
    assert packages <= copied, f"Dockerfile does not COPY {sorted(packages - copied)}"
    # .dockerignore lets in only what is copied (no .venv or data in the build context)
    allowed = {line[1:] for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")}
    assert copied <= allowed, f".dockerignore leaves out {sorted(copied - allowed)}"
    for volume_dir in ("/var/lib/strata/metadata", "/var/lib/strata/logs-0", "/var/lib/strata/logs-1"):
        assert volume_dir in text, f"the image should create {volume_dir} for the volume's ownership"


def test_quickstart_compose_block_is_what_test_compose_runs() -> None:
    """tests/test_compose.py (make compose-test, not make test) runs the quickstart's block (docs/quickstart.md) word for word."""
    assert quickstart_block() == STEPS
