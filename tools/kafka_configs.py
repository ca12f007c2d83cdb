"""kafka-configs.sh: Kafka's ConfigCommand over the admin APIs.

    kafka-configs.sh --bootstrap-server H:P --describe --entity-type topics --entity-name t [--all]
    kafka-configs.sh --bootstrap-server H:P --describe --broker 1 --all
    kafka-configs.sh --bootstrap-server H:P --alter --topic t --add-config 'retention.ms=1000,cleanup.policy=[compact,delete]'
    kafka-configs.sh --bootstrap-server H:P --alter --broker-defaults --delete-config log.cleaner.threads
    kafka-configs.sh --bootstrap-server H:P --alter --user alice --client app --add-config producer_byte_rate=1024
    kafka-configs.sh --bootstrap-server H:P --alter --user alice \\
        --add-config 'SCRAM-SHA-256=[iterations=8192,password=alice-secret]'
    kafka-configs.sh --bootstrap-server H:P --alter --ip 10.0.0.1 --add-config connection_creation_rate=5
    kafka-configs.sh --bootstrap-server H:P --alter --broker-logger 1 --add-config broker.replication=DEBUG

Topics and brokers go through DescribeConfigs / IncrementalAlterConfigs (a broker's configs are
asked of that broker, as Kafka's admin client does); users' and clients' quotas through
DescribeClientQuotas / AlterClientQuotas; users' SCRAM credentials through
Describe/AlterUserScramCredentials, the password salted here (PBKDF2, a random salt) so only the
salted password travels; ips' connection_creation_rate through the client quota APIs too;
broker loggers (BROKER_LOGGER resources) through DescribeConfigs / IncrementalAlterConfigs sent to
the broker named; groups (KIP-848 consumer groups' consumer.session.timeout.ms and
consumer.heartbeat.interval.ms) through DescribeConfigs / IncrementalAlterConfigs of GROUP
resources; client-metrics (KIP-714 subscriptions: metrics, interval.ms, match) through
DescribeConfigs / IncrementalAlterConfigs of CLIENT_METRICS resources, listed with
ListConfigResources. Output lines and messages
are Kafka's. Bad arguments (an unknown entity type, a malformed --add-config, a non-numeric quota)
are one line and exit 2, before any connection;
what the cluster refuses (an unknown config key, a missing topic) is one line and exit 1.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import socket
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from metadata.client_quotas import CLIENT_KEYS, IP_KEYS
from metadata.config_effects import ignored
from node.config import ConfigError, load_properties
from node.scram import MAX_ITERATIONS, MECHANISM_NAMES, MIN_ITERATIONS, SCRAM_MECHANISMS, salted_password
from protocol.errors import Errors, error_name
from protocol.generated.alter_client_quotas import AlterClientQuotasRequest
from protocol.generated.alter_user_scram_credentials import AlterUserScramCredentialsRequest
from protocol.generated.describe_client_quotas import DescribeClientQuotasRequest
from protocol.generated.describe_configs import DescribeConfigsRequest
from protocol.generated.describe_user_scram_credentials import DescribeUserScramCredentialsRequest
from protocol.generated.incremental_alter_configs import IncrementalAlterConfigsRequest
from protocol.generated.list_config_resources import ListConfigResourcesRequest
from tools.admin import AdminError, ToolArgumentParser, admin_for, broker_error, run_tool
from tools.brokers import Brokers
from tools.kafka_consumer_groups import list_groups

TOPICS, BROKERS, USERS, CLIENTS, IPS = "topics", "brokers", "users", "clients", "ips"
BROKER_LOGGERS, CLIENT_METRICS, GROUPS = "broker-loggers", "client-metrics", "groups"
ENTITY_TYPES = (TOPICS, CLIENTS, USERS, BROKERS, IPS, BROKER_LOGGERS, CLIENT_METRICS, GROUPS)
TOPIC_RESOURCE, BROKER_RESOURCE, BROKER_LOGGER_RESOURCE, GROUP_RESOURCE = 2, 4, 8, 32
CLIENT_METRICS_RESOURCE = 16
RESOURCE_TYPES = {TOPICS: TOPIC_RESOURCE, BROKERS: BROKER_RESOURCE, BROKER_LOGGERS: BROKER_LOGGER_RESOURCE,
                  GROUPS: GROUP_RESOURCE, CLIENT_METRICS: CLIENT_METRICS_RESOURCE}
SOURCE_NAMES = {1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG", 3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
                4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG", 6: "DYNAMIC_BROKER_LOGGER_CONFIG",
                7: "CLIENT_METRICS_CONFIG", 8: "DYNAMIC_GROUP_CONFIG"}
QUOTA_ENTITY = {USERS: "user", CLIENTS: "client-id", IPS: "ip"}
SET, DELETE = 0, 1
DEFAULT_ITERATIONS = 4096  # Kafka's
# Kafka splits --add-config on commas outside square brackets
_SPLIT = re.compile(r",(?=[^\]]*(?:\[|$))")
_CREDENTIAL = re.compile(r"(?:iterations=(-?[0-9]*),)?password=(.*)", re.DOTALL)


class _Entity(argparse.Action):
    """--entity-type/--entity-name/--entity-default and Kafka's shortcuts (--topic, --broker,
    --broker-defaults, --user, --user-defaults, --client, --client-defaults) in command-line
    order, which pairs each name with its type (users and clients may come together)."""

    def __init__(self, *args: Any, kind: str, entity_type: str | None = None, **kwargs: Any) -> None:
        self.kind, self.entity_type = kind, entity_type
        super().__init__(*args, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        events = list(getattr(ns, "entities", None) or [])
        if self.entity_type:
            events.append(("type", self.entity_type))
        if self.kind == "type":
            events.append(("type", values))
        elif self.kind == "name":
            events.append(("name", values))
        elif self.kind == "default":
            events.append(("name", ""))
        ns.entities = events


def build_parser() -> ToolArgumentParser:
    ap = ToolArgumentParser(prog="kafka-configs.sh",
                            description="Add, remove or describe configs of topics, brokers, users and clients.")
    ap.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]")
    act = ap.add_mutually_exclusive_group(required=True)
    act.add_argument("--alter", action="store_true", help="Alter the configuration for the entity.")
    act.add_argument("--describe", action="store_true", help="List configs for the given entity.")
    ap.add_argument("--all", action="store_true", help="List all configs for the given entity, including static ones.")
    ap.set_defaults(entities=[])
    ap.add_argument("--entity-type", action=_Entity, kind="type", help="topics/clients/users/brokers")
    ap.add_argument("--entity-name", action=_Entity, kind="name",
                    help="topic name/client id/user principal name/broker id")
    ap.add_argument("--entity-default", action=_Entity, kind="default", nargs=0,
                    help="the default entity of the type before it (clients/users/brokers)")
    for flag, etype, help_ in (("--topic", TOPICS, "The topic's name."), ("--broker", BROKERS, "The broker's ID."),
                               ("--user", USERS, "The user's principal name."), ("--client", CLIENTS, "The client's ID."),
                               ("--broker-logger", BROKER_LOGGERS, "The broker's ID for its logger config."),
                               ("--ip", IPS, "The IP address."), ("--group", GROUPS, "The group's ID."),
                               ("--client-metrics", CLIENT_METRICS, "The client metrics config resource name.")):
        ap.add_argument(flag, action=_Entity, kind="name", entity_type=etype, help=help_)
    for flag, etype in (("--broker-defaults", BROKERS), ("--user-defaults", USERS), ("--client-defaults", CLIENTS),
                        ("--ip-defaults", IPS)):
        ap.add_argument(flag, action=_Entity, kind="default", entity_type=etype, nargs=0,
                        help=f"The config defaults for all {etype}.")
    ap.add_argument("--add-config", metavar="k1=v1,k2=[v1,v2],k3=v3",
                    help="Configs to add; square brackets group values that contain commas.")
    ap.add_argument("--add-config-file", metavar="FILE", help="A properties file of configs to add.")
    ap.add_argument("--delete-config", metavar="k1,k2", help="Config keys to remove.")
    ap.add_argument("--timeout", type=float, default=30.0, help=argparse.SUPPRESS)
    return ap


def parse_add_config(value: str) -> dict[str, str]:
    """'k1=v1,k2=[a,b]' -> {k1: v1, k2: 'a,b'} (ValueError when a piece is not key=value)."""
    out = {}
    for piece in _SPLIT.split(value):
        key, eq, val = piece.partition("=")
        if not eq or not key.strip():
            raise ValueError('Invalid entity config: all configs to be added must be in the format "key=val" '
                             'or "key=[val1,val2]"')
        val = val.strip()
        if val.startswith("[") and val.endswith("]"):
            val = val[1:-1]
        out[key.strip()] = val
    return out


def _is_ip(name: str) -> bool:
    """Kafka's check of an ip entity: an IP address, or a host name that resolves."""
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    try:
        socket.getaddrinfo(name, None)
        return True
    except (OSError, UnicodeError):
        return False


def _java_double(v: float) -> str:
    """Java's Double.toString, which Kafka prints quota values with (1024.0, 1.0E7)."""
    if v != 0 and not 1e-3 <= abs(v) < 1e7:
        mantissa, exp = f"{v:.16E}".split("E")
        mantissa = mantissa.rstrip("0")
        mantissa += "0" if mantissa.endswith(".") else ""
        return f"{mantissa}E{int(exp)}"
    return repr(float(v))


class Command:
    """One checked command line: entity types and names, the configs to add and delete."""

    def __init__(self, ap: ToolArgumentParser, a: argparse.Namespace) -> None:
        self.a = a
        self.types = [v for k, v in a.entities if k == "type"]
        self.names = [v for k, v in a.entities if k == "name"]
        self.add: dict[str, str] = {}
        self.delete: list[str] = []
        try:
            self._check()
        except ValueError as e:
            ap.error(str(e))

    def _check(self) -> None:
        a, types, names = self.a, self.types, self.names
        if not types:
            raise ValueError("At least one entity type must be specified")
        for t in types:
            if t not in ENTITY_TYPES:
                raise ValueError(f"Invalid entity-type {t}, --entity-type must be one of {', '.join(ENTITY_TYPES)}")
        if len(types) > 1 and sorted(types) != [CLIENTS, USERS]:
            raise ValueError(f"Only '{USERS}' and '{CLIENTS}' entity types may be specified together")
        if len(names) > len(types):
            raise ValueError("More entity names specified than entity types")
        head = types[0]
        if head in (TOPICS, BROKER_LOGGERS, GROUPS, CLIENT_METRICS) and "" in names:
            raise ValueError(f"--entity-default is not valid for {head}")
        if head in (BROKERS, BROKER_LOGGERS) and names and names[0] and not names[0].isdigit():
            raise ValueError(f"The entity name for {head} must be a valid integer broker id, found: {names[0]}")
        if head == IPS and names and names[0] and not _is_ip(names[0]):
            raise ValueError(f"The entity name for {head} must be a valid IP or resolvable host, but it is: "
                             f"{names[0][:60]}")
        if head == BROKER_LOGGERS and not names:
            raise ValueError(f"An entity name must be specified with --{'describe' if a.describe else 'alter'} "
                             f"of {head}")
        if a.describe:
            if a.add_config or a.add_config_file or a.delete_config:
                raise ValueError("--describe takes no --add-config, --add-config-file or --delete-config")
            return
        if a.all:
            raise ValueError("--all is only valid with --describe")
        if head in (TOPICS, GROUPS, CLIENT_METRICS) and not names:
            raise ValueError(f"--entity-name must be specified with --alter of {head}")
        if len(names) != len(types):
            raise ValueError("--entity-name or --entity-default must be specified with each --entity-type for --alter")
        if not (a.add_config or a.add_config_file or a.delete_config):
            raise ValueError("At least one of --add-config, --add-config-file, or --delete-config must be specified "
                             "with --alter")
        if a.add_config and a.add_config_file:
            raise ValueError("Only one of --add-config or --add-config-file must be specified")
        if a.add_config:
            self.add = parse_add_config(a.add_config)
        if a.add_config_file:
            try:
                self.add = dict(load_properties(a.add_config_file))
            except (OSError, ConfigError) as e:
                raise ValueError(f"--add-config-file {a.add_config_file}: {e}") from None
        self.delete = [k.strip() for k in (a.delete_config or "").split(",") if k.strip()]
        both = sorted(set(self.add) & set(self.delete))
        if both:
            raise ValueError(f"Invalid config(s) to both add and delete: {', '.join(both)}")
        if head in (USERS, CLIENTS):
            self._check_quota_keys(head)
        if head == IPS:
            unknown = [k for k in list(self.add) + self.delete if k not in IP_KEYS]
            if unknown:
                raise ValueError(f"Only connection quota configs can be added for '{IPS}' using --bootstrap-server. "
                                 f"Unexpected config names: {','.join(unknown)}")
            self._check_numbers(self.add)

    def _check_numbers(self, keys: Iterable[str]) -> None:
        for k in keys:
            v = self.add[k]
            try:
                float(v)
            except ValueError:
                raise ValueError(f"Cannot parse quota configuration value for {k}: {v}") from None

    def _check_quota_keys(self, head: str) -> None:
        scram = set(SCRAM_MECHANISMS) if head == USERS and CLIENTS not in self.types and "" not in self.names else set()
        unknown = [k for k in list(self.add) + self.delete if k not in CLIENT_KEYS and k not in scram]
        if unknown:
            raise ValueError(f"Only quota configs can be added for '{head}' using --bootstrap-server. "
                             f"Unexpected config names: {', '.join(unknown)}")
        self._check_numbers([k for k in self.add if k in CLIENT_KEYS])
        for k, v in self.add.items():
            if k not in CLIENT_KEYS:
                m = _CREDENTIAL.fullmatch(v)
                if not m:
                    raise ValueError(f"Invalid credential property {k}={v}")
                if m.group(1) not in (None, "", "-1"):
                    iterations = int(m.group(1))
                    if iterations < MIN_ITERATIONS:
                        raise ValueError(f"Iterations {m.group(1)} is less than the minimum {MIN_ITERATIONS} required for {k}")
                    if iterations > MAX_ITERATIONS:
                        # refused here: the password is hashed with them before anything is sent
                        raise ValueError(f"Iterations {m.group(1)} is more than the maximum {MAX_ITERATIONS} allowed for {k}")


# ---- topics and brokers

async def resource_configs(brokers: Brokers, etype: str, name: str, synonyms: bool) -> list[Any]:
    """DescribeConfigs entries of one topic or broker ('' = the cluster default), by name; a
    broker's configs come from that broker."""
    rtype = RESOURCE_TYPES[etype]
    req = DescribeConfigsRequest(resources=[DescribeConfigsRequest.DescribeConfigsResource(
        resource_type=rtype, resource_name=name, configuration_keys=None)], include_synonyms=synonyms)
    if etype in (BROKERS, BROKER_LOGGERS) and name:
        resp = await brokers.send(int(name), req)
    else:
        resp = await brokers.admin.request(req)
    r = resp.results[0]
    if r.error_code:
        raise broker_error(f"describing configs of {etype[:-1]} '{name}'", r.error_code, r.error_message)
    return sorted(r.configs, key=lambda c: c.name)


def _dynamic_source(etype: str, name: str) -> int | None:
    """The source --describe shows without --all (None: every entry, as for broker loggers)."""
    if etype == GROUPS:
        return 8
    if etype == CLIENT_METRICS:
        return 7
    return None if etype == BROKER_LOGGERS else 1 if etype == TOPICS else 2 if name else 3


async def describe_resources(brokers: Brokers, etype: str, name: str | None, describe_all: bool) -> None:
    if name is None and etype == GROUPS:
        entities = [g for g, _ in await list_groups(brokers)]
    elif name is None and etype == CLIENT_METRICS:
        resp = await brokers.admin.request(ListConfigResourcesRequest(resource_types=[CLIENT_METRICS_RESOURCE]))
        if resp.error_code:
            raise broker_error("listing client metrics resources", resp.error_code, None)
        entities = sorted(r.resource_name for r in resp.config_resources)
    elif name is None:
        if etype == TOPICS:
            entities = sorted(t for t in await brokers.topics())
        else:
            await brokers.topics([])
            entities = [str(b) for b in sorted(brokers.addresses)] + [""]
    else:
        if not describe_all and etype not in (BROKER_LOGGERS, GROUPS, CLIENT_METRICS):  # those answer for any name
            if etype == TOPICS:
                known = name in await brokers.topics([name])
            else:
                await brokers.topics([])
                known = name == "" or int(name) in brokers.addresses
            if not known:
                print(f"The {etype[:-1]} '{name}' doesn't exist and doesn't have dynamic config.")
                return
        entities = [name]
    for entity in entities:
        if entity == "" and etype == BROKERS:
            print(f"Default configs for {etype} in the cluster are:")
        else:
            print(f"{'All' if describe_all else 'Dynamic'} configs for {etype[:-1]} {entity} are:")
        wanted = _dynamic_source(etype, entity)
        for c in await resource_configs(brokers, etype, entity, True):
            if describe_all or wanted is None or c.config_source == wanted:
                syn = ", ".join(f"{SOURCE_NAMES.get(s.source, 'UNKNOWN')}:{s.name}={_v(s.value)}" for s in c.synonyms)
                # a key Strata accepts (so Kafka's files load) but does not act on says so, and why
                why = ignored(c.name) if etype in (TOPICS, BROKERS) else None
                mark = f" (ignored by Strata: {why})" if why else ""
                print(f"  {c.name}={_v(c.value)} sensitive={str(c.is_sensitive).lower()} synonyms={{{syn}}}{mark}")


def _v(value: str | None) -> str:
    return "null" if value is None else value


async def alter_resource(brokers: Brokers, cmd: Command, etype: str, name: str) -> None:
    current = {c.name for c in await resource_configs(brokers, etype, name, False)
               if c.config_source == _dynamic_source(etype, name)}
    missing = [k for k in cmd.delete if k not in current]
    if missing:
        raise AdminError(f"Invalid config(s): {','.join(missing)}", Errors.INVALID_CONFIG)
    R = IncrementalAlterConfigsRequest
    ops = [R.AlterableConfig(name=k, config_operation=DELETE, value=None) for k in cmd.delete]
    ops += [R.AlterableConfig(name=k, config_operation=SET, value=v) for k, v in cmd.add.items()]
    rtype = RESOURCE_TYPES[etype]
    resp = await brokers.admin.request(
        R(resources=[R.AlterConfigsResource(resource_type=rtype, resource_name=name, configs=ops)]),
        to_controller=True)
    for r in resp.responses:
        if r.error_code:
            raise broker_error(f"altering configs of {etype[:-1]} '{name}'", r.error_code, r.error_message)


# ---- users and clients

def _components(cmd: Command) -> list[Any]:
    C = DescribeClientQuotasRequest.ComponentData
    out = []
    for i, t in enumerate(cmd.types):
        n = cmd.names[i] if i < len(cmd.names) else None
        # match types: 0 the named entity, 1 the default entity, 2 any entity of the type
        out.append(C(entity_type=QUOTA_ENTITY[t], match_type=2 if n is None else 1 if n == "" else 0,
                     match=None if not n else n))
    return out


async def quota_configs(brokers: Brokers, cmd: Command) -> list[tuple[dict[str, str | None], dict[str, float]]]:
    resp = await brokers.admin.request(DescribeClientQuotasRequest(components=_components(cmd), strict=True))
    if resp.error_code:
        raise broker_error("describing client quotas", resp.error_code, resp.error_message)
    return [({e.entity_type: e.entity_name for e in entry.entity}, {v.key: v.value for v in entry.values})
            for entry in resp.entries or []]


def _entity_text(entity: dict[str, str | None]) -> str:
    parts = []
    for key, word in (("user", "user-principal"), ("client-id", "client-id"), ("ip", "ip")):
        if key in entity:
            parts.append(f"the default {word}" if not entity[key] else f"{word} '{entity[key]}'")
    return ", ".join(parts)


async def describe_quotas_and_scram(brokers: Brokers, cmd: Command) -> None:
    found = await quota_configs(brokers, cmd)
    for entity, values in sorted(found, key=lambda f: sorted((k, v or "") for k, v in f[0].items())):
        text = ", ".join(f"{k}={_java_double(v)}" for k, v in sorted(values.items()))
        print(f"Quota configs for {_entity_text(entity)} are {text}")
    if CLIENTS in cmd.types or IPS in cmd.types or "" in cmd.names:
        return
    users = [DescribeUserScramCredentialsRequest.UserName(name=n) for n in cmd.names] or None
    resp = await brokers.admin.request(DescribeUserScramCredentialsRequest(users=users))
    if resp.error_code:
        raise broker_error("describing users", resp.error_code, resp.error_message)
    for r in resp.results:
        if r.error_code:
            print(f"Error retrieving SCRAM credential configs for user-principal '{r.user}': "
                  f"{error_name(r.error_code)}: {r.error_message}")
            continue
        creds = ", ".join(f"{MECHANISM_NAMES.get(c.mechanism, c.mechanism)}=iterations={c.iterations}"
                          for c in r.credential_infos)
        print(f"SCRAM credential configs for user-principal '{r.user}' are {creds}")


async def alter_quotas(brokers: Brokers, cmd: Command, add: dict[str, str], delete: list[str]) -> None:
    found = await quota_configs(brokers, cmd)
    current = found[0][1] if found else {}
    missing = [k for k in delete if k not in current]
    if missing:
        raise AdminError(f"Invalid config(s): {','.join(missing)}", Errors.INVALID_CONFIG)
    R = AlterClientQuotasRequest
    entity = [R.EntityData(entity_type=QUOTA_ENTITY[t], entity_name=n or None) for t, n in zip(cmd.types, cmd.names)]
    ops = [R.OpData(key=k, value=float(v), remove=False) for k, v in add.items()]
    ops += [R.OpData(key=k, value=0.0, remove=True) for k in delete]
    resp = await brokers.admin.request(R(entries=[R.EntryData(entity=entity, ops=ops)]), to_controller=True)
    for e in resp.entries:
        if e.error_code:
            raise broker_error(f"altering quotas of {_entity_text({x.entity_type: x.entity_name for x in e.entity})}",
                               e.error_code, e.error_message)


async def alter_scram(brokers: Brokers, user: str, add: dict[str, str], delete: list[str]) -> None:
    R = AlterUserScramCredentialsRequest
    upserts = []
    for mech, value in add.items():
        m = _CREDENTIAL.fullmatch(value)
        assert m is not None  # checked with the arguments
        iterations = int(m.group(1)) if m.group(1) not in (None, "", "-1") else DEFAULT_ITERATIONS
        mid, hash_name = SCRAM_MECHANISMS[mech]
        salt = os.urandom(32)
        upserts.append(R.ScramCredentialUpsertion(
            name=user, mechanism=mid, iterations=iterations, salt=salt,
            salted_password=salted_password(hash_name, m.group(2), salt, iterations)))
    deletions = [R.ScramCredentialDeletion(name=user, mechanism=SCRAM_MECHANISMS[m][0]) for m in delete]
    resp = await brokers.admin.request(R(deletions=deletions, upsertions=upserts), to_controller=False)
    for r in resp.results:
        if r.error_code:
            raise broker_error(f"altering user {r.user}", r.error_code, r.error_message)


async def alter_loggers(brokers: Brokers, cmd: Command, broker: str) -> None:
    """As Kafka: every logger named must exist on that broker; the change goes to that broker."""
    known = {c.name for c in await resource_configs(brokers, BROKER_LOGGERS, broker, False)}
    invalid = [k for k in cmd.delete if k not in known] + [k for k in cmd.add if k not in known]
    if invalid:
        raise AdminError(f"Invalid broker logger(s): {','.join(invalid)}", Errors.INVALID_CONFIG)
    R = IncrementalAlterConfigsRequest
    ops = [R.AlterableConfig(name=k, config_operation=SET, value=v) for k, v in cmd.add.items()]
    ops += [R.AlterableConfig(name=k, config_operation=DELETE, value="") for k in cmd.delete]
    resp = await brokers.send(int(broker), R(resources=[R.AlterConfigsResource(
        resource_type=BROKER_LOGGER_RESOURCE, resource_name=broker, configs=ops)]))
    for r in resp.responses:
        if r.error_code:
            raise broker_error(f"altering the loggers of broker {broker}", r.error_code, r.error_message)


async def run(cmd: Command) -> None:
    a, head = cmd.a, cmd.types[0]
    name = cmd.names[0] if cmd.names else None
    async with admin_for(a, a.timeout) as admin, Brokers(admin) as brokers:
        if a.describe:
            if head in (TOPICS, BROKERS, BROKER_LOGGERS, GROUPS, CLIENT_METRICS):
                await describe_resources(brokers, head, name, a.all)
            else:
                await describe_quotas_and_scram(brokers, cmd)
            return
        assert name is not None  # --alter names every entity (checked with the arguments)
        if head in (TOPICS, BROKERS, GROUPS, CLIENT_METRICS):
            await alter_resource(brokers, cmd, head, name)
        elif head == BROKER_LOGGERS:
            await alter_loggers(brokers, cmd, name)
        else:
            scram_add = {k: v for k, v in cmd.add.items() if k in SCRAM_MECHANISMS}
            scram_delete = [k for k in cmd.delete if k in SCRAM_MECHANISMS]
            quota_add = {k: v for k, v in cmd.add.items() if k not in SCRAM_MECHANISMS}
            quota_delete = [k for k in cmd.delete if k not in SCRAM_MECHANISMS]
            if quota_add or quota_delete:
                await alter_quotas(brokers, cmd, quota_add, quota_delete)
            if scram_add or scram_delete:
                await alter_scram(brokers, name, scram_add, scram_delete)
    if name:
        print(f"Completed updating config for {head[:-1]} {name}.")
    else:
        print(f"Completed updating default config for {head} in the cluster.")


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    return run_tool(run(Command(ap, ap.parse_tool_args(argv))))


if __name__ == "__main__":
    sys.exit(main())
