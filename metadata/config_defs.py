"""Topic and dynamic broker config definitions: names, types, defaults, validation.

Shared by the controller (validating CreateTopics and config changes) and brokers (DescribeConfigs,
each log's effective config), so both agree on what a valid config is. Names, types and defaults are Kafka 4.0's, with one deliberate
difference: `segment.bytes` accepts values down to 14 bytes (Kafka 3.x's floor, 4.0 raised it
to 1 MiB) so tests can roll segments quickly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import cast

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

# DescribeConfigs / CreateTopics ConfigSource values (Kafka's numbering)
SOURCE_TOPIC = 1
SOURCE_DYNAMIC_BROKER = 2
SOURCE_DYNAMIC_DEFAULT_BROKER = 3
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5

Validator = Callable[[object], "str | None"]


@dataclass(frozen=True)
class ConfigDef:
    name: str
    type: str  # BOOLEAN, INT, LONG, DOUBLE, STRING, LIST
    default: str | None
    validator: Validator | None = None
    # Broker properties that set the cluster-wide default, tried in order: (name, multiplier)
    synonyms: tuple[tuple[str, int], ...] = ()


class ConfigValueError(ValueError):
    """A config value that does not parse or is out of range; the message names the config."""


def _at_least(lo: float) -> Validator:
    return lambda v: None if v >= lo else f"must be at least {lo}"  # type: ignore[operator]


def _between(lo: float, hi: float) -> Validator:
    return lambda v: None if lo <= v <= hi else f"must be between {lo} and {hi}"  # type: ignore[operator]


def _one_of(*allowed: str, case_insensitive: bool = False) -> Validator:
    def check(v: object) -> str | None:
        s = str(v)
        ok = s.lower() in {a.lower() for a in allowed} if case_insensitive else s in allowed
        return None if ok else f"must be one of {', '.join(allowed)}"

    return check


def _list_of(*allowed: str) -> Validator:
    def check(v: object) -> str | None:
        bad = [x for x in cast("list[str]", v) if x not in allowed]  # a LIST config's parsed value
        return f"contains {', '.join(bad)}; allowed values are {', '.join(allowed)}" if bad else None

    return check


def _gzip_level(v: object) -> str | None:
    return None if v == -1 or 1 <= v <= 9 else "must be -1 (the codec default) or between 1 and 9"  # type: ignore[operator]


_THROTTLED = re.compile(r"\d+:\d+")


def _throttled_replicas(v: object) -> str | None:
    items = list(v)  # type: ignore[call-overload]
    if items == ["*"] or all(_THROTTLED.fullmatch(x) for x in items):
        return None
    return "must be '*' or a list of partition:broker pairs such as 0:101,0:102"


def _d(
    name: str, type_: str, default: str | None, validator: Validator | None = None, *synonyms: str | tuple[str, int]
) -> ConfigDef:
    syn = tuple(s if isinstance(s, tuple) else (s, 1) for s in synonyms)
    return ConfigDef(name, type_, default, validator, syn)


_TOPIC_DEFS = [
    _d("cleanup.policy", "LIST", "delete", _list_of("compact", "delete"), "log.cleanup.policy"),
    _d(
        "compression.type",
        "STRING",
        "producer",
        _one_of("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
        "compression.type",
    ),
    _d("compression.gzip.level", "INT", "-1", _gzip_level, "compression.gzip.level"),
    _d("compression.lz4.level", "INT", "9", _between(1, 17), "compression.lz4.level"),
    _d("compression.zstd.level", "INT", "3", _between(-131072, 22), "compression.zstd.level"),
    _d("delete.retention.ms", "LONG", "86400000", _at_least(0), "log.cleaner.delete.retention.ms"),
    _d("diskless.enable", "BOOLEAN", "false"),  # Strata/Inkless: set at creation, immutable
    _d("file.delete.delay.ms", "LONG", "60000", _at_least(0), "log.segment.delete.delay.ms"),
    _d("flush.messages", "LONG", str(INT64_MAX), _at_least(1), "log.flush.interval.messages"),
    _d("flush.ms", "LONG", str(INT64_MAX), _at_least(0), "log.flush.interval.ms"),
    _d("follower.replication.throttled.replicas", "LIST", "", _throttled_replicas),
    _d("index.interval.bytes", "INT", "4096", _at_least(0), "log.index.interval.bytes"),
    _d("leader.replication.throttled.replicas", "LIST", "", _throttled_replicas),
    _d("local.retention.bytes", "LONG", "-2", _at_least(-2), "log.local.retention.bytes"),
    _d("local.retention.ms", "LONG", "-2", _at_least(-2), "log.local.retention.ms"),
    _d("max.compaction.lag.ms", "LONG", str(INT64_MAX), _at_least(1), "log.cleaner.max.compaction.lag.ms"),
    _d("max.message.bytes", "INT", "1048588", _at_least(0), "message.max.bytes"),
    _d("message.timestamp.after.max.ms", "LONG", "3600000", _at_least(0), "log.message.timestamp.after.max.ms"),
    _d("message.timestamp.before.max.ms", "LONG", str(INT64_MAX), _at_least(0), "log.message.timestamp.before.max.ms"),
    _d(
        "message.timestamp.type",
        "STRING",
        "CreateTime",
        _one_of("CreateTime", "LogAppendTime"),
        "log.message.timestamp.type",
    ),
    _d("min.cleanable.dirty.ratio", "DOUBLE", "0.5", _between(0, 1), "log.cleaner.min.cleanable.ratio"),
    _d("min.compaction.lag.ms", "LONG", "0", _at_least(0), "log.cleaner.min.compaction.lag.ms"),
    _d("min.insync.replicas", "INT", "1", _at_least(1), "min.insync.replicas"),
    _d("preallocate", "BOOLEAN", "false", None, "log.preallocate"),
    _d("remote.log.copy.disable", "BOOLEAN", "false"),
    _d("remote.log.delete.on.disable", "BOOLEAN", "false"),
    _d("remote.storage.enable", "BOOLEAN", "false"),
    _d("retention.bytes", "LONG", "-1", None, "log.retention.bytes"),
    _d(
        "retention.ms",
        "LONG",
        "604800000",
        _at_least(-1),
        "log.retention.ms",
        ("log.retention.minutes", 60_000),
        ("log.retention.hours", 3_600_000),
    ),
    _d("segment.bytes", "INT", "1073741824", _at_least(14), "log.segment.bytes"),
    _d("segment.index.bytes", "INT", "10485760", _at_least(4), "log.index.size.max.bytes"),
    _d("segment.jitter.ms", "LONG", "0", _at_least(0), "log.roll.jitter.ms", ("log.roll.jitter.hours", 3_600_000)),
    _d("segment.ms", "LONG", "604800000", _at_least(1), "log.roll.ms", ("log.roll.hours", 3_600_000)),
    _d("unclean.leader.election.enable", "BOOLEAN", "false", None, "unclean.leader.election.enable"),
]
TOPIC_CONFIGS: dict[str, ConfigDef] = {d.name: d for d in _TOPIC_DEFS}


def _broker_defs() -> dict[str, ConfigDef]:
    """Broker configs that may be set dynamically (per broker or cluster-wide): the topic
    defaults' broker synonyms, plus throttles and thread pools."""
    out: dict[str, ConfigDef] = {}
    for d in _TOPIC_DEFS:
        for syn, mult in d.synonyms:
            type_ = "INT" if mult != 1 else d.type
            validator = None if mult != 1 else d.validator
            out[syn] = ConfigDef(syn, type_, None, validator)
    for name, type_, validator in [
        ("leader.replication.throttled.rate", "LONG", _at_least(0)),
        ("follower.replication.throttled.rate", "LONG", _at_least(0)),
        ("replica.alter.log.dirs.io.max.bytes.per.second", "LONG", _at_least(0)),
        ("intra.broker.throttled.rate", "LONG", _at_least(0)),
        ("num.replica.move.threads", "INT", _at_least(1)),
        ("num.io.threads", "INT", _at_least(1)),
        ("num.network.threads", "INT", _at_least(1)),
        ("num.replica.fetchers", "INT", _at_least(1)),
        ("num.recovery.threads.per.data.dir", "INT", _at_least(1)),
        ("background.threads", "INT", _at_least(1)),
        ("log.cleaner.threads", "INT", _at_least(0)),
        ("log.cleaner.io.max.bytes.per.second", "DOUBLE", None),
        ("log.cleaner.dedupe.buffer.size", "LONG", None),
        ("log.cleaner.io.buffer.size", "INT", _at_least(0)),
        ("log.cleaner.io.buffer.load.factor", "DOUBLE", None),
        ("log.cleaner.backoff.ms", "LONG", _at_least(0)),
        ("max.connections", "INT", _at_least(0)),
        ("max.connections.per.ip", "INT", _at_least(0)),
        ("max.connections.per.ip.overrides", "STRING", None),
        ("max.connection.creation.rate", "INT", _at_least(0)),
    ]:
        out[name] = ConfigDef(name, type_, None, validator)
    return out


BROKER_CONFIGS: dict[str, ConfigDef] = _broker_defs()
# Kafka's GroupConfig (KIP-848): per-group overrides of the broker's group.consumer.* settings
GROUP_CONFIGS: dict[str, ConfigDef] = {d.name: d for d in [
    ConfigDef("consumer.session.timeout.ms", "INT", "45000", _at_least(1), (("group.consumer.session.timeout.ms", 1),)),
    ConfigDef("consumer.heartbeat.interval.ms", "INT", "5000", _at_least(1),
              (("group.consumer.heartbeat.interval.ms", 1),)),
    # KIP-932's share group settings
    ConfigDef("share.auto.offset.reset", "STRING", "latest", lambda v: _share_reset(v)),
    ConfigDef("share.isolation.level", "STRING", "read_uncommitted", _one_of("read_uncommitted", "read_committed")),
    ConfigDef("share.record.lock.duration.ms", "INT", "30000", _at_least(1000),
              (("group.share.record.lock.duration.ms", 1),)),
]}
# KIP-714's client metrics subscriptions (kafka-configs.sh --entity-type client-metrics)
CLIENT_METRICS_MATCH_KEYS = ("client_instance_id", "client_id", "client_software_name", "client_software_version",
                             "client_source_address", "client_source_port")


def _match_patterns(v: object) -> str | None:
    for entry in cast("list[str]", v):
        key, eq, pattern = entry.partition("=")
        if not eq or key.strip() not in CLIENT_METRICS_MATCH_KEYS:
            return (f"{entry!r} is not key=regex with a key among {', '.join(CLIENT_METRICS_MATCH_KEYS)}")
        try:
            re.compile(pattern.strip())
        except re.error as e:
            return f"{pattern!r} is not a regular expression ({e})"
    return None


CLIENT_METRICS_CONFIGS: dict[str, ConfigDef] = {d.name: d for d in [
    ConfigDef("metrics", "LIST", ""),  # metric name prefixes; "*" means all
    ConfigDef("interval.ms", "INT", "300000", _between(100, 3600000)),
    ConfigDef("match", "LIST", "", _match_patterns),  # key=regex on the client's identity, all must match
]}
# Strata's own broker settings (diskless storage and what follows) are free-form until they get
# definitions; they are accepted as strings so tools can set them.
BROKER_CONFIG_PREFIXES = ("diskless.",)

_TYPE_WORDS = {
    "INT": "a whole number (INT)",
    "LONG": "a whole number (LONG)",
    "DOUBLE": "a decimal number (DOUBLE)",
    "BOOLEAN": "true or false (BOOLEAN)",
}


def parse_value(d: ConfigDef, value: str) -> object:
    """The typed value, or ConfigValueError naming the config and what was expected."""
    s = value.strip()
    try:
        if d.type in ("INT", "LONG"):
            n = int(s)
            lim = INT32_MAX if d.type == "INT" else INT64_MAX
            if not -lim - 1 <= n <= lim:
                raise ValueError
            parsed: object = n
        elif d.type == "DOUBLE":
            parsed = float(s)
        elif d.type == "BOOLEAN":
            if s.lower() not in ("true", "false"):
                raise ValueError
            parsed = s.lower() == "true"
        elif d.type == "LIST":
            parsed = [x.strip() for x in s.split(",") if x.strip()]
        else:
            parsed = value
    except ValueError:
        raise ConfigValueError(
            f"Invalid value {value!r} for config {d.name}: expected {_TYPE_WORDS[d.type]}."
        ) from None
    if d.validator is not None:
        problem = d.validator(parsed)
        if problem:
            raise ConfigValueError(f"Invalid value {value!r} for config {d.name}: {problem}.")
    return parsed


def validate_topic_config(name: str, value: str) -> None:
    d = TOPIC_CONFIGS.get(name)
    if d is None:
        raise ConfigValueError(f"Unknown topic config name: {name}.")
    parse_value(d, value)


def validate_broker_config(name: str, value: str) -> None:
    d = BROKER_CONFIGS.get(name)
    if d is None:
        if name.startswith(BROKER_CONFIG_PREFIXES):
            return
        raise ConfigValueError(f"Unknown or not dynamically settable broker config name: {name}.")
    parse_value(d, value)


_ISO_DURATION = re.compile(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?", re.IGNORECASE)


def iso_duration_ms(text: str) -> int | None:
    """An ISO-8601 duration PnDTnHnMnS in milliseconds, or None when it is not one."""
    m = _ISO_DURATION.fullmatch(text.strip())
    if not m or not any(m.groups()):
        return None
    d, h, mi, s = m.groups()
    return int((int(d or 0) * 86400 + int(h or 0) * 3600 + int(mi or 0) * 60 + float(s or 0)) * 1000)


def _share_reset(v: object) -> str | None:
    """Kafka's share.auto.offset.reset: latest, earliest or by_duration:PnDTnHnMnS."""
    s = str(v).strip().lower()
    if s in ("latest", "earliest"):
        return None
    if s.startswith("by_duration:") and iso_duration_ms(s[len("by_duration:"):]) is not None:
        return None
    return "must be one of latest, earliest, by_duration:PnDTnHnMnS"


# a group's value must lie within the broker's bounds (Kafka's GroupConfig.validate)
GROUP_CONFIG_BOUNDS = {
    "consumer.session.timeout.ms": (("group.consumer.min.session.timeout.ms", 45000),
                                    ("group.consumer.max.session.timeout.ms", 60000)),
    "consumer.heartbeat.interval.ms": (("group.consumer.min.heartbeat.interval.ms", 5000),
                                       ("group.consumer.max.heartbeat.interval.ms", 15000)),
}


def validate_group_config(name: str, value: str, props: Mapping[str, str] | None = None) -> None:
    d = GROUP_CONFIGS.get(name)
    if d is None:
        raise ConfigValueError(f"Unknown group config name: {name}.")
    v = parse_value(d, value)
    if name not in GROUP_CONFIG_BOUNDS:
        return
    (lo_name, lo_default), (hi_name, hi_default) = GROUP_CONFIG_BOUNDS[name]
    lo, hi = (int((props or {}).get(n) or default) for n, default in ((lo_name, lo_default), (hi_name, hi_default)))
    if not lo <= v <= hi:  # type: ignore[operator]
        raise ConfigValueError(f"Invalid value {value} for config {name}: must be between {lo_name} ({lo}) and "
                               f"{hi_name} ({hi}).")


def validate_client_metrics_config(name: str, value: str) -> None:
    d = CLIENT_METRICS_CONFIGS.get(name)
    if d is None:
        raise ConfigValueError(f"Unknown client metrics config name: {name} (known: {', '.join(CLIENT_METRICS_CONFIGS)}).")
    parse_value(d, value)


def _defs(resource_type: int) -> dict[str, ConfigDef]:
    return {2: TOPIC_CONFIGS, 32: GROUP_CONFIGS, 16: CLIENT_METRICS_CONFIGS}.get(resource_type, BROKER_CONFIGS)


def config_type(resource_type: int, name: str) -> str | None:
    d = _defs(resource_type).get(name)
    return None if d is None else d.type


def default_value(resource_type: int, name: str) -> str | None:
    d = _defs(resource_type).get(name)
    return None if d is None else d.default


def effective_topic_configs(
    explicit: Mapping[str, str], cluster_dynamic: Mapping[str, str], static: Mapping[str, str]
) -> list[tuple[str, str | None, int]]:
    """(name, value, source) for every topic config, sorted by name: the topic's own value, else
    the cluster-wide dynamic broker default, else the static server.properties, else Kafka's."""
    out: list[tuple[str, str | None, int]] = []
    for name in sorted(TOPIC_CONFIGS):
        d = TOPIC_CONFIGS[name]
        if name in explicit:
            out.append((name, explicit[name], SOURCE_TOPIC))
            continue
        for props, source in ((cluster_dynamic, SOURCE_DYNAMIC_DEFAULT_BROKER), (static, SOURCE_STATIC_BROKER)):
            found = _from_synonyms(d, props)
            if found is not None:
                out.append((name, found, source))
                break
        else:
            out.append((name, d.default, SOURCE_DEFAULT))
    return out


def _from_synonyms(d: ConfigDef, props: Mapping[str, str]) -> str | None:
    for syn, mult in d.synonyms:
        raw = props.get(syn)
        if raw is None:
            continue
        if mult == 1:
            return raw
        try:
            return str(int(raw) * mult)
        except ValueError:
            continue
    return None


def topic_bool(
    name: str, explicit: Mapping[str, str], cluster_dynamic: Mapping[str, str], static: Mapping[str, str]
) -> bool:
    """A boolean topic config's effective value (unclean.leader.election.enable and the like)."""
    d = TOPIC_CONFIGS[name]
    raw = explicit.get(name)
    if raw is None:
        raw = _from_synonyms(d, cluster_dynamic)
    if raw is None:
        raw = _from_synonyms(d, static)
    if raw is None:
        raw = d.default
    return str(raw).strip().lower() == "true"
