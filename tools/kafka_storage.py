"""kafka-storage.sh for Strata: format a node's log dirs before its first start, as Kafka's
StorageTool (KIP-631).

    kafka-storage.sh random-uuid
    kafka-storage.sh format -t <cluster id> -c server.properties [--ignore-formatted]
                            [--standalone | --initial-controllers ID@HOST:PORT:DIRID,...
                             | --no-initial-controllers]
    kafka-storage.sh info -c server.properties

`format` writes Kafka's v1 meta.properties (cluster.id, node.id, directory.id, version) into
every dir of `log.dirs` (and a controller's `metadata.log.dir`). A quorum of more than one voter
must be formatted this way (or given one `cluster.id`), with one id on every voter; a single
voter and brokers format themselves on first start.

A quorum named by `controller.quorum.voters` is static (KIP-595): there `--standalone` and
`--initial-controllers` only confirm it (taken when they describe the configured voters, refused
otherwise). A controller configured with `controller.quorum.bootstrap.servers` instead keeps its
voters in the metadata log (KIP-853): `--standalone` (this node alone) or `--initial-controllers`
writes the first voter set into a bootstrap snapshot at offset 0, and `--no-initial-controllers`
formats a controller that joins as an observer until `kafka-metadata-quorum.sh add-controller`.
`--initial-controllers`' directory id of this node becomes its metadata dir's directory.id, as in
Kafka. SCRAM users are bootstrapped from the controller's `bootstrap.scram.credentials`, not
from `--add-scram`.

Errors: one line on stderr, exit 1 (a formatted dir, a bad id, a config without node.id or
log.dirs); bad arguments exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from controller.config import check_cluster_id
from controller.log_dirs import META_PROPERTIES, id_to_uuid, meta_text, random_id, write_atomically
from controller.snapshots import snapshot_name
from metadata.image import METADATA_TOPIC
from metadata.voters import Voter, VoterSet, voters_batch
from node.config import ConfigError, NodeConfig, parse_properties
from tools.admin import AdminError, ToolArgumentParser


def _config(path: str) -> NodeConfig:
    try:
        return NodeConfig.load(path)
    except ConfigError as e:
        raise AdminError(str(e)) from None


def _dirs(cfg: NodeConfig) -> tuple[list[Path], Path | None]:
    """(every dir to format, the metadata dir if this node is a controller)."""
    try:
        dirs = list(cfg.log_dirs)
    except ConfigError as e:
        raise AdminError(str(e)) from None
    if "controller" not in cfg.roles:
        return dirs, None
    meta = cfg.metadata_dir
    return (dirs if meta in dirs else [*dirs, meta]), meta


def _node_id(cfg: NodeConfig) -> int:
    try:
        return cfg.node_id
    except (ConfigError, KeyError, ValueError):
        raise AdminError("node.id is missing or not a number in the config") from None


def _initial_controllers(value: str) -> dict[int, tuple[str, int, str]]:
    """KIP-853's `id@host:port:directory-id,...` -> {id: (host, port, directory id)}."""
    out: dict[int, tuple[str, int, str]] = {}
    for item in filter(None, (x.strip() for x in value.split(","))):
        try:
            node, _, rest = item.partition("@")
            hostport, _, dir_id = rest.rpartition(":")
            host, _, port = hostport.rpartition(":")
            id_to_uuid(dir_id)
            out[int(node)] = (host.strip("[]"), int(port), dir_id)
        except (ValueError, TypeError):
            raise AdminError(f"--initial-controllers: {item!r} is not ID@HOST:PORT:DIRECTORY_ID") from None
    return out


def _controller_endpoint(cfg: NodeConfig) -> tuple[str, str, int]:
    """This controller's first controller listener as others dial it (advertised if set)."""
    for e in cfg.controller_endpoints:
        if e.host not in ("", "0.0.0.0", "::"):
            return e.listener, e.host, e.port
    names = ",".join(cfg.controller_listener_names)
    raise AdminError(f"--standalone: no controller listener ({names}) with a host others can dial")


def _voter_dir_id(a: argparse.Namespace, cfg: NodeConfig, node_id: int) -> tuple[str | None, VoterSet | None]:
    """Check --standalone / --initial-controllers / --no-initial-controllers; (the metadata dir's
    directory id they name for this node, the bootstrap voter set of a dynamic quorum)."""
    if not (a.standalone or a.initial_controllers or a.no_initial_controllers):
        return None, None
    if "controller" not in cfg.roles:
        raise AdminError("--standalone, --initial-controllers and --no-initial-controllers can only be used on a "
                         "controller")
    voters = cfg.quorum_voters
    if not voters:  # the voters live in the log (KIP-853): this writes the first set
        if a.no_initial_controllers:
            return None, None
        if a.standalone:
            dir_id = random_id()
            return dir_id, {node_id: Voter(node_id, id_to_uuid(dir_id), (_controller_endpoint(cfg),))}
        given = _initial_controllers(a.initial_controllers)
        if node_id not in given:
            raise AdminError(f"--initial-controllers does not name this node ({node_id})")
        listener = cfg.controller_listener_names[0]
        return given[node_id][2], {i: Voter(i, id_to_uuid(d), ((listener, h, p),)) for i, (h, p, d) in given.items()}
    if a.no_initial_controllers:
        raise AdminError("--no-initial-controllers is for a quorum without controller.quorum.voters (KIP-853): "
                         "this config names its voters")
    if a.standalone:
        if set(voters) != {node_id}:
            raise AdminError(f"--standalone makes node {node_id} the only voter, but controller.quorum.voters names "
                             f"{','.join(map(str, sorted(voters)))}: a quorum named by controller.quorum.voters is "
                             "static (KIP-595), format each voter with the same -t and without --standalone")
        return None, None
    given = _initial_controllers(a.initial_controllers)
    named = {i: (h, p) for i, (h, p, _) in given.items()}
    if named != voters:
        want = ",".join(f"{i}@{h}:{p}" for i, (h, p) in sorted(voters.items()))
        raise AdminError(f"--initial-controllers must name the voters of controller.quorum.voters ({want}): "
                         "a quorum named by controller.quorum.voters is static (KIP-595)")
    if node_id not in given:
        raise AdminError(f"--initial-controllers does not name this node ({node_id})")
    return given[node_id][2], None


def _write_bootstrap(meta_dir: Path, voters: VoterSet) -> None:
    """The bootstrap snapshot at offset 0 holding the first voter set (KIP-853), where Kafka's
    format writes its bootstrap checkpoint."""
    d = meta_dir / f"{METADATA_TOPIC}-0"
    d.mkdir(parents=True, exist_ok=True)
    write_atomically(d / snapshot_name(0), voters_batch(voters, 0, int(time.time() * 1000)))


def format_dirs(a: argparse.Namespace) -> None:
    cfg = _config(a.config)
    node_id = _node_id(cfg)
    try:
        check_cluster_id(a.cluster_id)
    except ConfigError as e:
        raise AdminError(f"--cluster-id: {e}".replace("cluster.id: ", "")) from None
    configured = (cfg.props.get("cluster.id") or "").strip()
    if configured and configured != a.cluster_id:
        raise AdminError(f"--cluster-id {a.cluster_id} differs from cluster.id {configured} in {a.config}")
    dirs, meta_dir = _dirs(cfg)
    meta_dir_id, bootstrap_voters = _voter_dir_id(a, cfg, node_id)
    todo = []
    for d in dirs:
        if (d / META_PROPERTIES).exists():
            if not a.ignore_formatted:
                raise AdminError(f"Log directory {d} is already formatted. Use --ignore-formatted to ignore this "
                                 "directory and format the others.")
            continue
        if d.is_dir() and any(p.name != "lost+found" for p in d.iterdir()):
            raise AdminError(f"Log directory {d} holds files but no {META_PROPERTIES}; refusing to format it")
        todo.append(d)
    if not todo:
        print("All of the log directories are already formatted.")
        return
    for d in todo:
        try:
            d.mkdir(parents=True, exist_ok=True)
            dir_id = meta_dir_id if d == meta_dir and meta_dir_id else random_id()
            write_atomically(d / META_PROPERTIES,
                             meta_text(a.cluster_id, node_id, dir_id, "kafka-storage.sh format").encode())
        except OSError as e:
            raise AdminError(f"cannot format {d}: {e.strerror or e}") from None
        kind = "metadata" if d == meta_dir else "data"
        print(f"Formatting {kind} directory {d} with cluster.id {a.cluster_id}.")
        if d == meta_dir and bootstrap_voters:
            try:
                _write_bootstrap(d, bootstrap_voters)
            except OSError as e:
                raise AdminError(f"cannot write the bootstrap snapshot in {d}: {e.strerror or e}") from None
            print(f"Bootstrap voters: {', '.join(f'{v.id}@{v.address[0]}:{v.address[1]}' for v in bootstrap_voters.values())}.")


def info(a: argparse.Namespace) -> int:
    """Kafka's `info` layout: the dirs found, the metadata they hold, then problems (exit 1)."""
    cfg = _config(a.config)
    dirs, _ = _dirs(cfg)
    found, problems, metas = [], [], []
    for d in dirs:
        if not d.is_dir():
            problems.append(f"{d} does not exist")
            continue
        found.append(d)
        path = d / META_PROPERTIES
        if not path.exists():
            problems.append(f"{d} is not formatted.")
            continue
        try:
            props = parse_properties(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            problems.append(f"{path} cannot be read: {getattr(e, 'strerror', None) or e}")
            continue
        metas.append((d, {k: props[k] for k in sorted(props)}))
    ids = {m.get("cluster.id") for _, m in metas}
    if len(ids) > 1:
        problems.append(f"the log dirs name different cluster ids: {', '.join(sorted(str(i) for i in ids))}")
    if found:
        print("Found log directory:" if len(found) == 1 else "Found log directories:")
        for d in found:
            print(f"  {d}")
        print()
    # each dir's own directory.id aside, the dirs of one node hold one metadata: shown once
    shown = {", ".join(f"{k}={v}" for k, v in m.items() if k != "directory.id"): None for _, m in metas}
    for text in shown:
        print(f"Found metadata: {{{text}}}")
    if metas:
        print()
    if problems:
        print("Found problem:" if len(problems) == 1 else "Found problems:")
        for p in problems:
            print(f"  {p}")
        print()
        return 1
    return 0


def build_parser() -> ToolArgumentParser:
    ap = ToolArgumentParser(prog="kafka-storage.sh", description="Format and describe a node's log dirs.")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("random-uuid", help="print a new cluster id")
    f = sub.add_parser("format", help="write meta.properties into every log dir of a node")
    f.add_argument("-c", "--config", required=True, metavar="FILE", help="the node's server.properties")
    f.add_argument("-t", "--cluster-id", required=True, metavar="ID", help="the cluster id (kafka-storage.sh random-uuid)")
    f.add_argument("-g", "--ignore-formatted", action="store_true", help="skip dirs already formatted")
    voters = f.add_mutually_exclusive_group()
    voters.add_argument("-s", "--standalone", action="store_true",
                        help="this controller is the quorum's first and only voter")
    voters.add_argument("-I", "--initial-controllers", metavar="ID@HOST:PORT:DIRID,...",
                        help="the quorum's first voters (with controller.quorum.voters: they must be those)")
    voters.add_argument("-N", "--no-initial-controllers", action="store_true",
                        help="a controller that joins an existing quorum as an observer (add it with "
                             "kafka-metadata-quorum.sh add-controller)")
    i = sub.add_parser("info", help="show what the node's log dirs hold")
    i.add_argument("-c", "--config", required=True, metavar="FILE", help="the node's server.properties")
    return ap


def run(a: argparse.Namespace) -> int:
    if a.command == "random-uuid":
        print(random_id())
        return 0
    if a.command == "info":
        return info(a)
    format_dirs(a)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        return run(a)
    except (AdminError, ConfigError) as e:
        sys.stdout.flush()
        print(f"Error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
