"""server.properties: Kafka's property names, parsed and typed.

Bad values raise ConfigError naming the key, so a process fails at start with one clear line.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Endpoint:
    listener: str  # listener name, e.g. PLAINTEXT or CONTROLLER
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.listener}://{self.host}:{self.port}"


def parse_properties(text: str) -> dict[str, str]:
    """The subset of Java .properties we need: key=value or key: value, # and ! comments,
    backslash line continuations."""
    props: dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        while line.endswith("\\") and i < len(lines):
            line = line[:-1] + lines[i].strip()
            i += 1
        if not line or line[0] in "#!":
            continue
        m = re.match(r"([^=:\s]+)\s*[=:\s]\s*(.*)$", line)
        if not m:
            props[line] = ""
            continue
        props[m.group(1)] = m.group(2).strip()
    return props


def load_properties(path: str | Path) -> dict[str, str]:
    try:
        return parse_properties(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8 text: {e.reason} at byte {e.start}") from None


def parse_listeners(value: str, key: str = "listeners") -> list[Endpoint]:
    out = []
    for item in filter(None, (x.strip() for x in value.split(","))):
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)://(\[[^\]]*\]|[^:]*):(\d+)", item)
        if not m:
            raise ConfigError(f"{key}: {item!r} is not NAME://HOST:PORT")
        host = m.group(2).strip("[]") or "0.0.0.0"
        out.append(Endpoint(m.group(1).upper(), host, int(m.group(3))))
    return out


def parse_voters(value: str) -> dict[int, tuple[str, int]]:
    """controller.quorum.voters: ``1@host:port,2@host:port``."""
    out = {}
    for item in filter(None, (x.strip() for x in value.split(","))):
        m = re.fullmatch(r"(\d+)@(\[[^\]]*\]|[^:]+):(\d+)", item)
        if not m:
            raise ConfigError(f"controller.quorum.voters: {item!r} is not ID@HOST:PORT")
        out[int(m.group(1))] = (m.group(2).strip("[]"), int(m.group(3)))
    return out


def parse_bootstrap_servers(value: str) -> list[tuple[str, int]]:
    """controller.quorum.bootstrap.servers (KIP-853): ``host:port,host:port``."""
    out = []
    for item in filter(None, (x.strip() for x in value.split(","))):
        m = re.fullmatch(r"(\[[^\]]*\]|[^:@]+):(\d+)", item)
        if not m:
            raise ConfigError(f"controller.quorum.bootstrap.servers: {item!r} is not HOST:PORT")
        out.append((m.group(1).strip("[]"), int(m.group(2))))
    return out


class NodeConfig:
    """Typed access to a server.properties mapping."""

    def __init__(self, props: Mapping[str, str]) -> None:
        self.props = dict(props)

    @classmethod
    def load(cls, path: str | Path) -> NodeConfig:
        return cls(load_properties(path))

    def has(self, key: str) -> bool:
        return key in self.props

    def str(self, key: str, default: str | None = None) -> str:
        if key in self.props:
            return self.props[key]
        if default is None:
            raise ConfigError(f"{key} is required")
        return default

    def int(self, key: builtins.str, default: builtins.int | None = None) -> builtins.int:
        raw = self.props.get(key)
        if raw is None:
            if default is None:
                raise ConfigError(f"{key} is required")
            return default
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{key}: {raw!r} is not an integer") from None

    def bool(self, key: builtins.str, default: builtins.bool) -> builtins.bool:
        raw = self.props.get(key)
        if raw is None:
            return default
        if raw.lower() not in ("true", "false"):
            raise ConfigError(f"{key}: {raw!r} is not true or false")
        return raw.lower() == "true"

    def list(self, key: builtins.str, default: builtins.list[builtins.str] | None = None) -> builtins.list[builtins.str]:
        raw = self.props.get(key)
        if raw is None:
            if default is None:
                raise ConfigError(f"{key} is required")
            return default
        return [x.strip() for x in raw.split(",") if x.strip()]

    # ---- the keys every node reads
    @property
    def node_id(self) -> builtins.int:
        return self.int("node.id")

    @property
    def roles(self) -> set[builtins.str]:
        roles = set(self.list("process.roles"))
        if not roles or not roles <= {"broker", "controller"}:
            raise ConfigError(f"process.roles: {self.props.get('process.roles')!r} must be broker and/or controller")
        return roles

    @property
    def listeners(self) -> builtins.list[Endpoint]:
        return parse_listeners(self.str("listeners"))

    @property
    def advertised_listeners(self) -> builtins.list[Endpoint]:
        if self.has("advertised.listeners"):
            return parse_listeners(self.str("advertised.listeners"), "advertised.listeners")
        return self.listeners

    @property
    def controller_listener_names(self) -> builtins.list[builtins.str]:
        return [x.upper() for x in self.list("controller.listener.names", ["CONTROLLER"])]

    @property
    def quorum_voters(self) -> dict[builtins.int, tuple[builtins.str, builtins.int]]:
        """Empty when unset: the voters are then in the metadata log (KIP-853)."""
        return parse_voters(self.str("controller.quorum.voters", ""))

    @property
    def quorum_bootstrap_servers(self) -> builtins.list[tuple[builtins.str, builtins.int]]:
        """Where to find the quorum when its voters are not configured (KIP-853)."""
        return parse_bootstrap_servers(self.str("controller.quorum.bootstrap.servers", ""))

    @property
    def log_dirs(self) -> builtins.list[Path]:
        dirs = self.list("log.dirs", []) or self.list("log.dir", [])
        if not dirs:
            raise ConfigError("log.dirs is required")
        return [Path(d) for d in dirs]

    @property
    def metadata_dir(self) -> Path:
        """A controller's metadata log dir: `metadata.log.dir`, else the first log dir."""
        return Path(self.props["metadata.log.dir"]) if self.props.get("metadata.log.dir") else self.log_dirs[0]

    @property
    def controller_endpoints(self) -> builtins.list[Endpoint]:
        """A controller's controller listeners as others dial them: each one's advertised
        endpoint if `advertised.listeners` names it, else its bind endpoint."""
        names = self.controller_listener_names
        adv = {e.listener: e for e in self.advertised_listeners if e.listener in names}
        return [adv.get(e.listener, e) for e in self.listeners if e.listener in names]
