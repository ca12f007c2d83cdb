"""The whole config table walked: every broker, controller and topic key Strata accepts has an
effect, is refused with a message naming it, or is marked by `kafka-configs.sh --describe` as
accepted but ignored (metadata/config_effects.py says which and why).

- by reading the code: each key the processes read is in the table, each key of the catalogs is
  in exactly one class, and each "effect" key has a reader;
- on real processes: a broker (and a controller) started with each refused key exits 2 with one
  line naming it; IncrementalAlterConfigs of each refused topic and dynamic broker key is refused
  naming it, at the accepted value it is taken; describe --all marks every ignored key; a key
  that is neither Kafka's nor Strata's is named in a warning at start.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from metadata import config_effects as fx
from metadata.broker_defaults import BROKER_CATALOG
from metadata.config_defs import BROKER_CONFIGS, CLIENT_METRICS_CONFIGS, TOPIC_CONFIGS
from tests.conftest import installed_script
from tools.cluster import Cluster, render_properties

ROOT = Path(__file__).resolve().parent.parent
CATALOG_MODULES = {"metadata/broker_defaults.py", "metadata/config_defs.py", "metadata/config_effects.py"}
# how the processes read a key: cfg.int("k"), props.get("k"), listener_prop(cfg, l, "k"), ...
READ = re.compile(r"""(?:\.(?:int|str|bool|list|get|has|float)\(|props\[|listener_prop\([^,]+,[^,]+,|_int\([^,]+,)\s*"""
                  r"""["']([a-z][a-z0-9_]*(?:\.[a-z0-9_-]+)+)["']""")
NOT_CONFIG = {"directory.id", "node.id", "cluster.id", "version"}  # meta.properties fields read with the same calls
CLIENT_SIDE = {"security.protocol", "sasl.mechanism", "sasl.username", "sasl.password"}  # --command-config files
OTHER_RESOURCES = set(CLIENT_METRICS_CONFIGS)  # a client-metrics resource's own keys, read from its records


def _sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for d in ("broker", "controller", "node", "metadata")
            for p in (ROOT / d).rglob("*.py") if "generated" not in p.parts}


def _bad_value(allowed: str | None) -> str:
    return {None: "x", "false": "true", "true": "false", "producer": "zstd", "JKS": "PKCS12",
            "TLSv1.3": "TLSv1.2", "TLSv1.2,TLSv1.3": "TLSv1.3"}.get(allowed, "1")


def test_every_key_is_in_one_class_and_effect_keys_are_read() -> None:
    sources = _sources()
    code = {f: t for f, t in sources.items() if f not in CATALOG_MODULES}
    read = {m.group(1) for t in code.values() for m in READ.finditer(t)} - NOT_CONFIG - CLIENT_SIDE - OTHER_RESOURCES
    assert not [k for k in read if not fx.is_known(k)], "keys read but missing from the table"

    def has_reader(key: str) -> bool:
        return any(f'"{key}"' in t or f"'{key}'" in t for t in code.values())

    catalog = set(BROKER_CATALOG) | set(BROKER_CONFIGS) | set(TOPIC_CONFIGS)
    assert not (set(fx.IGNORED) & set(fx.REFUSED))
    assert set(fx.IGNORED) | set(fx.REFUSED) <= catalog, "the table names keys no catalog has"
    topic_of = {syn: name for name, d in TOPIC_CONFIGS.items() for syn, _ in d.synonyms}
    silent = []
    for key in sorted(catalog | set(fx.STRATA_KEYS)):
        if key in fx.IGNORED or key in fx.REFUSED:
            continue
        # a broker key that sets a topic default acts through its topic key
        if not has_reader(key) and not (key in topic_of and has_reader(topic_of[key])):
            silent.append(key)
    assert silent == [], f"keys accepted with no reader and not in the table: {silent}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("config-table"), brokers=1, verbose=False,
                per_broker_overrides={1: {"no.such.setting": "1", "num.io.threads": "16"}})
    try:
        c.start()
        yield c
    finally:
        c.stop()


def test_refused_keys_stop_a_broker_and_a_controller_at_start(cluster: Cluster, tmp_path: Path) -> None:
    configs = cluster.generate_configs()
    runs = []
    for key, (allowed, _) in sorted(fx.REFUSED.items()):
        bad = _bad_value(allowed)
        for role, name in (("broker", "broker-1"), ("controller", "controller")):
            if role == "controller" and key not in ("ssl.keystore.location", "delete.topic.enable",
                                                    "log.flush.interval.messages"):
                continue  # the same check (first_refusal) as the broker's: three keys show it
            path = tmp_path / f"{role}-{key}.properties"
            path.write_text(render_properties({**configs[name], key: bad}, "refused key"))
            proc = subprocess.Popen([sys.executable, "-m", role, "--config", str(path)], cwd=tmp_path,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            runs.append((role, key, bad, proc))
            if len(runs) >= 6:
                _check_refused(runs.pop(0))
    for run in runs:
        _check_refused(run)


def _check_refused(run: tuple) -> None:
    role, key, bad, proc = run
    out, err = proc.communicate(timeout=60)
    prefix = "broker: config error: " if role == "broker" else f"controller: bad config {proc.args[-1]}: "
    assert proc.returncode == 2 and out == "", (role, key, proc.returncode, err)
    assert err.splitlines() == [f"{prefix}{fx.refusal(key, bad)}"], (role, key, err)
    assert err.startswith(f"{prefix}{key}={bad} is not supported: ")


def _configs(c: Cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([installed_script("kafka-configs.sh"), "--bootstrap-server", c.bootstrap, *args],
                          capture_output=True, text=True, timeout=60)


def test_alter_configs_refuses_each_refused_key_by_name(cluster: Cluster) -> None:
    r = subprocess.run([installed_script("kafka-topics.sh"), "--bootstrap-server", cluster.bootstrap, "--create",
                        "--topic", "walk", "--partitions", "1", "--replication-factor", "1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    targets = [("--topic", "walk", k) for k in fx.REFUSED_TOPIC]
    targets += [("--broker-defaults", None, k) for k in sorted(fx.REFUSED) if k in BROKER_CONFIGS]
    assert len(targets) > len(fx.REFUSED_TOPIC)
    for flag, name, key in targets:
        allowed = fx.REFUSED[key][0]
        where = [flag, name] if name else [flag]
        bad = _configs(cluster, "--alter", *where, "--add-config", f"{key}={_bad_value(allowed)}")
        assert bad.returncode == 1 and bad.stderr.count("\n") == 1, (key, bad.stderr)
        assert f"{key}={_bad_value(allowed)} is not supported: " in bad.stderr and "(INVALID_CONFIG)" in bad.stderr
        if allowed is not None:  # the value Strata behaves as is taken
            good = _configs(cluster, "--alter", *where, "--add-config", f"{key}={allowed}")
            assert good.returncode == 0, (key, good.stderr)
    # CreateTopics takes the same rule
    r = subprocess.run([installed_script("kafka-topics.sh"), "--bootstrap-server", cluster.bootstrap, "--create",
                        "--topic", "walk-2", "--partitions", "1", "--replication-factor", "1",
                        "--config", "remote.storage.enable=true"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "remote.storage.enable=true is not supported" in r.stderr, r.stderr


def test_describe_all_marks_every_ignored_key(cluster: Cluster) -> None:
    # an ignored key is accepted (here set dynamically), and said to be ignored
    assert _configs(cluster, "--alter", "--broker", "1", "--add-config", "num.replica.fetchers=4").returncode == 0
    for args, keys in ((("--broker", "1"), [k for k in fx.IGNORED if k in BROKER_CATALOG or k in BROKER_CONFIGS]),
                       (("--topic", "walk-ignored"), list(fx.IGNORED_TOPIC))):
        if args[0] == "--topic":
            subprocess.run([installed_script("kafka-topics.sh"), "--bootstrap-server", cluster.bootstrap, "--create",
                            "--topic", args[1], "--partitions", "1", "--replication-factor", "1"],
                           check=True, capture_output=True, timeout=60)
        r = _configs(cluster, "--describe", *args, "--all")
        assert r.returncode == 0, r.stderr
        lines = {line.split("=", 1)[0].strip(): line for line in r.stdout.splitlines()[1:]}
        for key, line in lines.items():
            why = fx.ignored(key)
            assert line.endswith(f" (ignored by Strata: {why})") if why else "ignored by Strata" not in line, line
        shown = [k for k in keys if k in lines]
        # every ignored key with a default (or set) is listed, and so marked
        assert len(shown) >= len(keys) - 3, sorted(set(keys) - set(shown))
        assert "num.io.threads" in lines or args[0] == "--topic"


def test_unknown_keys_are_named_at_start(cluster: Cluster) -> None:
    text = cluster.log_path(1).read_text()
    assert re.search(r"config_keys_unknown.* keys='?no\.such\.setting'? ", text), text[-2000:]
