"""A small async admin client shared by the kafka-*.sh clones and the cluster launcher.

It wraps node.client.NodeClient: connects to the first reachable bootstrap broker, and sends
admin mutations to the broker that Metadata names as controller (as Kafka's AdminClient does; in
KRaft that is a broker that forwards to the real controller). Results come back as the raw
response entries; `AdminError` carries a Kafka error code so a tool can print one clear line.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn, TypeGuard
from uuid import UUID

from node.causes import cause
from node.client import ClientError, NodeClient
from node.config import ConfigError, load_properties
from node.security import ClientSecurity, properties_client_security
from protocol.errors import error_message, error_name
from protocol.generated.create_partitions import CreatePartitionsRequest
from protocol.generated.create_topics import CreateTopicsRequest
from protocol.generated.delete_topics import DeleteTopicsRequest
from protocol.generated.describe_configs import DescribeConfigsRequest
from protocol.generated.metadata import MetadataRequest

RESOURCE_TOPIC = 2  # DescribeConfigs resource type
INT16 = (-(2**15), 2**15 - 1)
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
CONFIG_SOURCE_DEFAULT = 5  # DescribeConfigs v1+ config_source of a value nobody set


class AdminError(Exception):
    """An admin operation failed; `code` is the Kafka error code when the broker gave one."""

    def __init__(self, message: str, code: int | None = None) -> None:
        self.code = code
        super().__init__(message)

    def __str__(self) -> str:
        msg = " ".join(self.args[0].split())  # one line, whatever the broker put in its message
        if self.code:
            return f"{msg} ({error_name(self.code)})" if msg else f"{error_name(self.code)}: {error_message(self.code)}"
        return msg or "failed, and no reason was given"


def broker_error(what: str, code: int, message: str | None = None) -> AdminError:
    """`what` failed with Kafka error `code`; the broker's own message wins over our table's."""
    detail = (message or "").strip() or error_message(code)
    return AdminError(f"{what}: {detail}", code)


def read_json_object(path: str) -> dict:
    """A tool's JSON input file: readable, UTF-8, valid JSON, an object; else AdminError naming why."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise AdminError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise AdminError(f"{path} is not UTF-8 text: {e.reason} at byte {e.start}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise AdminError(f"{path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise AdminError(f"{path} is nested too deeply to be a tool's JSON file") from None
    except ValueError as e:  # an integer of more digits than Python converts (4300)
        raise AdminError(f"{path} holds a number too large for any field: {e}".split(";")[0]) from None
    big = _first_out_of_int64(doc)
    if big is not None:
        raise AdminError(f"{path}: the number {_short(big)} is out of range (a 64-bit integer at most)")
    if not isinstance(doc, dict):
        raise AdminError(f"{path} must hold a JSON object, not {type(doc).__name__}")
    return doc


def _first_out_of_int64(doc: Any) -> int | None:
    """The first integer in a parsed JSON document that no Kafka field can hold (walked without
    recursion: the parser's depth limit is the only one)."""
    stack = [doc]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, int) and not isinstance(v, bool) and not INT64[0] <= v <= INT64[1]:
            return v
    return None


def _short(n: int) -> str:
    text = str(n)
    return text if len(text) <= 24 else f"{text[:10]}...({len(text)} digits)"


def is_json_int(v: Any, bounds: tuple[int, int] = INT64) -> TypeGuard[int]:
    """A JSON integer within `bounds` (Python's bool is an int, JSON's true is not)."""
    return isinstance(v, int) and not isinstance(v, bool) and bounds[0] <= v <= bounds[1]


class ToolArgumentParser(argparse.ArgumentParser):
    """argparse for the kafka-*.sh tools: a usage error is one line on stderr and exit 2. Every
    tool takes Kafka's `--command-config client.properties` (security.protocol, sasl.mechanism,
    sasl.jaas.config or sasl.username/sasl.password, ssl.ca.location, ...)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # SUPPRESS: a subcommand's parser (one of these too) leaves the top level's value alone
        self.add_argument("--command-config", metavar="FILE", default=argparse.SUPPRESS,
                          help="client properties: security.protocol, sasl.mechanism, sasl.jaas.config, ssl.ca.location")

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def parse_tool_args(self, argv: Sequence[str] | None = None) -> argparse.Namespace:
        """parse_args, and a --bootstrap-server that is not HOST:PORT[,...] is a usage error."""
        a = self.parse_args(argv)
        if getattr(a, "bootstrap_server", None) is not None:
            try:
                parse_bootstrap(a.bootstrap_server)
            except AdminError as e:
                self.error(f"--bootstrap-server: {e}")
        return a


def ranged_int(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: an integer in lo..hi, else a usage error naming the range."""

    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{_short_text(value)!r} is not an integer") from None
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"{_short(n)} is out of range ({lo}..{hi})")
        return n

    return parse


def _short_text(value: str) -> str:
    return value if len(value) <= 40 else value[:20] + "..."


def read_versioned_json(path: str, version: int = 1) -> dict:
    """read_json_object, with Kafka's "version" check (a missing version counts as 1)."""
    doc = read_json_object(path)
    found = doc.get("version", 1)
    if not is_json_int(found) or found != version:
        raise AdminError(f'{path}: unsupported "version" {json.dumps(found)} (only {version} is supported)')
    return doc


def partition_entry(entry: Any, where: str) -> tuple[str, int]:
    """The (topic, partition) of one entry of a tool's partition list, checked the way Kafka's
    tools check it; `where` names the entry in the message."""
    if not isinstance(entry, dict):
        raise AdminError(f"{where} must be an object")
    topic, partition = entry.get("topic"), entry.get("partition")
    if not isinstance(topic, str) or not topic:
        raise AdminError(f'{where} needs a "topic" name')
    if not is_json_int(partition, (0, INT32[1])):
        raise AdminError(f'{where} ({topic}) needs a "partition" number from 0 to {INT32[1]}')
    return topic, partition


def parse_bootstrap(value: str) -> list[tuple[str, int]]:
    """``host:port,host:port`` (IPv6 hosts in brackets) -> [(host, port)]."""
    out = []
    for item in filter(None, (x.strip() for x in value.split(","))):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise AdminError(f"bootstrap server {_short_text(item)!r} is not HOST:PORT")
        if len(port) > 5 or not 1 <= int(port) <= 65535:
            raise AdminError(f"bootstrap server {_short_text(item)!r}: port {_short_text(port)} is out of range (1..65535)")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise AdminError("no bootstrap server given")
    return out


def topic_id_str(topic_id: UUID) -> str:
    """Kafka prints topic ids as URL-safe base64 without padding (Uuid.toString)."""
    return base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode()


class Admin:
    """``async with Admin("h:p,h:p") as admin: md = await admin.metadata()``."""

    def __init__(self, bootstrap: str | Sequence[tuple[str, int]], *, timeout: float = 30.0,
                 security: ClientSecurity | None = None) -> None:
        self.bootstrap = parse_bootstrap(bootstrap) if isinstance(bootstrap, str) else list(bootstrap)
        self.timeout = timeout
        self.security = security
        self.client: NodeClient | None = None
        self._controller: NodeClient | None = None

    async def connect(self) -> Admin:
        errors = []
        for host, port in self.bootstrap:
            try:
                self.client = await NodeClient(host, port, client_id="strata-admin", timeout=self.timeout,
                                               security=self.security).connect()
                return self
            except ClientError as e:
                errors.append(str(e))
        raise AdminError("; ".join(errors))

    async def close(self) -> None:
        for c in {id(c): c for c in (self.client, self._controller) if c is not None}.values():
            await c.close()
        self.client = self._controller = None

    async def __aenter__(self) -> Admin:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request(self, body: Any, *, to_controller: bool = False) -> Any:
        client = await self._controller_client() if to_controller else self._conn()
        try:
            return await client.request(body)
        except ClientError as e:
            raise AdminError(str(e)) from None

    def _conn(self) -> NodeClient:
        if self.client is None:
            raise AdminError("not connected")
        return self.client

    async def _controller_client(self) -> NodeClient:
        if self._controller is not None and self._controller.connected:
            return self._controller
        client = self._conn()
        md = await self.metadata([])
        target = next((b for b in md.brokers if b.node_id == md.controller_id), None)
        # The connected broker forwards admin mutations too; use it when the named controller is
        # not one we can reach as a broker, or is the broker we already talk to.
        if target is None or (target.host, target.port) == (client.host, client.port):
            self._controller = client
        else:
            try:
                self._controller = await NodeClient(
                    target.host, target.port, client_id="strata-admin", timeout=self.timeout, security=self.security
                ).connect()
            except ClientError:
                self._controller = client
        return self._controller

    # ---- requests
    async def metadata(self, topics: Iterable[str] | None = None, *, auto_create: bool = False) -> Any:
        """Metadata for `topics` (None = every topic, [] = brokers only); never creates topics
        unless asked, since the brokers run with auto.create.topics.enable=true."""
        req = MetadataRequest(
            topics=None if topics is None else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics],
            allow_auto_topic_creation=auto_create,
        )
        return await self.request(req)

    async def create_topics(
        self,
        topics: Sequence[tuple[str, int, int, Mapping[int, Sequence[int]] | None, Mapping[str, str] | None]],
        *,
        timeout_ms: int = 30000,
        validate_only: bool = False,
    ) -> list[Any]:
        """topics: (name, partitions, replication factor, {partition: [broker ids]} or None,
        configs or None). -1 counts mean the cluster's defaults. Returns the per-topic results."""
        T = CreateTopicsRequest
        req = T(
            topics=[
                T.CreatableTopic(
                    name=name,
                    num_partitions=-1 if assignment else partitions,
                    replication_factor=-1 if assignment else rf,
                    assignments=[
                        T.CreatableReplicaAssignment(partition_index=p, broker_ids=list(ids))
                        for p, ids in sorted((assignment or {}).items())
                    ],
                    configs=[T.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()],
                )
                for name, partitions, rf, assignment, configs in topics
            ],
            timeout_ms=timeout_ms,
            validate_only=validate_only,
        )
        resp = await self.request(req, to_controller=True)
        return list(resp.topics)

    async def delete_topics(self, names: Sequence[str], *, timeout_ms: int = 30000) -> list[Any]:
        controller = await self._controller_client()
        try:
            v = controller.version_for(DeleteTopicsRequest.API_KEY)
        except ClientError as e:
            raise AdminError(str(e)) from None
        # v6 names topics by state entries (name or id); older versions by a plain name list.
        if v >= 6:
            req = DeleteTopicsRequest(
                topics=[DeleteTopicsRequest.DeleteTopicState(name=n) for n in names], timeout_ms=timeout_ms
            )
        else:
            req = DeleteTopicsRequest(topic_names=list(names), timeout_ms=timeout_ms)
        resp = await self.request(req, to_controller=True)
        return list(resp.responses)

    async def create_partitions(
        self,
        counts: Mapping[str, int],
        assignments: Mapping[str, Sequence[Sequence[int]]] | None = None,
        *,
        timeout_ms: int = 30000,
    ) -> list[Any]:
        """Grow each topic to counts[topic] partitions; assignments give the new partitions' replicas."""
        R = CreatePartitionsRequest
        req = R(
            topics=[
                R.CreatePartitionsTopic(
                    name=name,
                    count=count,
                    # null (not empty) lets the controller place the new partitions
                    assignments=[R.CreatePartitionsAssignment(broker_ids=list(ids)) for ids in assignments[name]]
                    if assignments and name in assignments
                    else None,
                )
                for name, count in counts.items()
            ],
            timeout_ms=timeout_ms,
        )
        resp = await self.request(req, to_controller=True)
        return list(resp.results)

    async def describe_topic_configs(self, names: Sequence[str]) -> dict[str, list[Any]]:
        """Every config of each topic, as DescribeConfigs result entries; raises on a topic error."""
        if not names:
            return {}
        R = DescribeConfigsRequest
        req = R(
            resources=[
                R.DescribeConfigsResource(resource_type=RESOURCE_TOPIC, resource_name=n, configuration_keys=None)
                for n in names
            ]
        )
        resp = await self.request(req)
        out = {}
        for r in resp.results:
            if r.error_code:
                raise broker_error(
                    f"cannot describe configs of topic '{r.resource_name}'", r.error_code, r.error_message
                )
            out[r.resource_name] = list(r.configs)
        return out


def non_default_configs(entries: Iterable[Any]) -> dict[str, str]:
    """The configs a topic overrides, as kafka-topics.sh --describe shows them."""
    out = {}
    for e in entries:
        if e.is_default or e.config_source == CONFIG_SOURCE_DEFAULT or e.value is None:
            continue
        out[e.name] = e.value
    return dict(sorted(out.items()))


__all__ = [
    "Admin",
    "AdminError",
    "broker_error",
    "non_default_configs",
    "parse_bootstrap",
    "topic_id_str",
]


def command_security(path: str | None) -> ClientSecurity | None:
    """The security settings of a --command-config file (AdminError when unusable)."""
    if not path:
        return None
    try:
        return properties_client_security(load_properties(path), path)
    except ConfigError as e:
        raise AdminError(str(e)) from None


def admin_for(a: argparse.Namespace, timeout: float) -> Admin:
    """The Admin a tool's --bootstrap-server and --command-config ask for."""
    return Admin(a.bootstrap_server, timeout=timeout, security=command_security(getattr(a, "command_config", None)))


def run_tool(coro: Any) -> int:
    """A tool's exit: 0, or one clear line on stderr and 1 for an AdminError, 130 on Ctrl-C."""
    try:
        asyncio.run(coro)
    except AdminError as e:
        sys.stdout.flush()
        print(f"Error: {e}", file=sys.stderr)
        return 1
    except (ClientError, OSError, TimeoutError) as e:
        # a failure no step turned into an AdminError: its cause, never a traceback or ""
        # (a closed stdout pipe, `| head`, is an OSError too: it ends quietly)
        if isinstance(e, BrokenPipeError):
            return _quiet_pipe()
        sys.stdout.flush()
        print(f"Error: {cause(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _quiet_pipe() -> int:
    # whoever read our output went away (`| head`): stop quietly, as Unix tools do
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1
