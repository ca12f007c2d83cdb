"""DescribeConfigs from the image (topic overrides, this broker's properties, Kafka's defaults,
client metrics subscriptions); ListConfigResources (KIP-1142; v0 was KIP-714's
ListClientMetricsResources) from the image; AlterConfigs and IncrementalAlterConfigs are forwarded
to the controller, except for broker loggers (broker_loggers.py), answered here."""

from __future__ import annotations

from collections.abc import Mapping

from broker.apis import broker_loggers
from broker.apis.registry import RequestContext, api
from metadata import config_defs as defs
from metadata.broker_defaults import BROKER_CATALOG, BROKER_DEFAULTS, broker_synonyms, is_sensitive
from metadata.image import BROKER_RESOURCE, CLIENT_METRICS_RESOURCE, GROUP_RESOURCE, TOPIC_RESOURCE
from protocol.errors import Errors
from protocol.generated.alter_configs import AlterConfigsResponse
from protocol.generated.describe_configs import DescribeConfigsResponse
from protocol.generated.incremental_alter_configs import IncrementalAlterConfigsResponse
from protocol.generated.list_config_resources import ListConfigResourcesResponse

R = DescribeConfigsResponse
# Kafka's ConfigSource and ConfigType numbers.
DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG = 1, 2, 3
STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 4, 5
CLIENT_METRICS_CONFIG, DYNAMIC_GROUP_CONFIG = 7, 8
CONFIG_TYPES = {"BOOLEAN": 1, "STRING": 2, "INT": 3, "SHORT": 4, "LONG": 5, "DOUBLE": 6, "LIST": 7, "PASSWORD": 9}


@api(32, 1, 4)
async def describe_configs(ctx: RequestContext, req) -> DescribeConfigsResponse:
    results = []
    for res in req.resources:
        r = R.DescribeConfigsResult(resource_type=res.resource_type, resource_name=res.resource_name)
        results.append(r)
        if res.resource_type == TOPIC_RESOURCE:
            _topic(ctx, req, res, r)
        elif res.resource_type == BROKER_RESOURCE:
            _broker(ctx, req, res, r)
        elif res.resource_type == broker_loggers.BROKER_LOGGER:
            broker_loggers.describe(res, ctx.services.config.node_id, r)
        elif res.resource_type == GROUP_RESOURCE:
            _group(ctx, req, res, r)
        elif res.resource_type == CLIENT_METRICS_RESOURCE:
            _client_metrics(ctx, res, r)
        else:
            r.error_code = Errors.INVALID_REQUEST
            r.error_message = f"resource type {res.resource_type} is not supported"
    return R(results=results)


def _group(ctx: RequestContext, req, res, r) -> None:
    """A KIP-848 group's configs (Kafka's GroupConfig): its own value, else the broker's
    group.consumer.* setting, else Kafka's default. Any group id may be described."""
    s = ctx.services
    explicit = s.metadata.image.configs.get((GROUP_RESOURCE, res.resource_name), {})
    for name, d in sorted(defs.GROUP_CONFIGS.items()):
        if not _wanted(res, name):
            continue
        synonyms = _synonyms([n for n, _ in d.synonyms], [(s.config.props, STATIC_BROKER_CONFIG)])
        if name in explicit:
            synonyms.insert(0, R.DescribeConfigsSynonym(name=name, value=explicit[name], source=DYNAMIC_GROUP_CONFIG))
        value, source = (synonyms[0].value, synonyms[0].source) if synonyms else (d.default, DEFAULT_CONFIG)
        r.configs.append(R.DescribeConfigsResourceResult(
            name=name, value=value, read_only=False, is_default=source == DEFAULT_CONFIG, config_source=source,
            is_sensitive=False, synonyms=synonyms if req.include_synonyms else [],
            config_type=CONFIG_TYPES.get(d.type, 0), documentation=None))


def _client_metrics(ctx: RequestContext, res, r) -> None:
    """A client metrics subscription (KIP-714): its values, else Kafka's defaults. Any name may
    be described (one that was never set shows the defaults, as in Kafka)."""
    explicit = ctx.services.metadata.image.configs.get((CLIENT_METRICS_RESOURCE, res.resource_name), {})
    for name, d in sorted(defs.CLIENT_METRICS_CONFIGS.items()):
        if not _wanted(res, name):
            continue
        value, source = (explicit[name], CLIENT_METRICS_CONFIG) if name in explicit else (d.default, DEFAULT_CONFIG)
        r.configs.append(R.DescribeConfigsResourceResult(
            name=name, value=value, read_only=False, is_default=source == DEFAULT_CONFIG, config_source=source,
            is_sensitive=False, synonyms=[], config_type=CONFIG_TYPES.get(d.type, 0), documentation=None))


# ListConfigResources: what an empty ResourceTypes lists (Kafka 4.1's supported types)
LISTED_TYPES = (TOPIC_RESOURCE, BROKER_RESOURCE, broker_loggers.BROKER_LOGGER, CLIENT_METRICS_RESOURCE, GROUP_RESOURCE)


@api(74, 0, 1)
async def list_config_resources(ctx: RequestContext, req) -> ListConfigResourcesResponse:
    """Topics and brokers that exist (a broker's loggers are a resource of each broker), and the
    client metrics subscriptions and groups that have configs in the metadata."""
    L = ListConfigResourcesResponse
    types = [CLIENT_METRICS_RESOURCE] if ctx.api_version == 0 else list(req.resource_types) or list(LISTED_TYPES)
    if any(t not in LISTED_TYPES for t in types):
        return L(throttle_time_ms=0, error_code=Errors.UNSUPPORTED_VERSION, config_resources=[])
    image = ctx.services.metadata.image
    out = []
    for t in dict.fromkeys(types):
        if t == TOPIC_RESOURCE:
            names = sorted(tp.name for tp in image.topics.values())
        elif t in (BROKER_RESOURCE, broker_loggers.BROKER_LOGGER):
            names = [str(b) for b in sorted(image.brokers)]
        else:
            names = sorted(name for (rtype, name) in image.configs if rtype == t)
        out += [L.ConfigResource(resource_name=n, resource_type=t) for n in names]
    return L(throttle_time_ms=0, error_code=0, config_resources=out)


def _wanted(res, name: str) -> bool:
    return res.configuration_keys is None or name in res.configuration_keys


def _topic(ctx: RequestContext, req, res, r) -> None:
    s = ctx.services
    image = s.metadata.image
    if image.topic(res.resource_name) is None:
        r.error_code = Errors.UNKNOWN_TOPIC_OR_PARTITION
        r.error_message = f"topic '{res.resource_name}' does not exist"
        return
    explicit = image.topic_config(res.resource_name)
    cluster = image.configs.get((BROKER_RESOURCE, ""), {})
    # As Kafka: the topic's own value, then its broker keys' values source by source; a config no
    # broker key sets (remote.storage.enable, diskless.enable) has no synonyms beyond its own.
    layers = [(cluster, DYNAMIC_DEFAULT_BROKER_CONFIG), (s.config.props, STATIC_BROKER_CONFIG),
              (BROKER_DEFAULTS, DEFAULT_CONFIG)]
    for name, value, source in defs.effective_topic_configs(explicit, cluster, s.config.props):
        if not _wanted(res, name):
            continue
        d = defs.TOPIC_CONFIGS[name]
        synonyms = _synonyms([n for n, _ in d.synonyms], layers)
        if name in explicit:
            synonyms.insert(0, R.DescribeConfigsSynonym(name=name, value=explicit[name], source=DYNAMIC_TOPIC_CONFIG))
        r.configs.append(
            R.DescribeConfigsResourceResult(
                name=name,
                value=value,
                read_only=False,
                is_default=source == DEFAULT_CONFIG,
                config_source=source,
                is_sensitive=False,
                synonyms=synonyms if req.include_synonyms else [],
                config_type=CONFIG_TYPES.get(d.type, 0),
                documentation=None,
            )
        )


def _synonyms(names: list[str] | tuple[str, ...], layers: list[tuple[Mapping[str, str], int]]) -> list:
    """Kafka's synonym order: source by source (most specific first), each over `names` in order."""
    return [R.DescribeConfigsSynonym(name=n, value=layer[n], source=src)
            for layer, src in layers for n in names if n in layer]


def _broker(ctx: RequestContext, req, res, r) -> None:
    """As Kafka: a broker id lists every broker config (defaults, the properties file, dynamic
    per-broker and cluster-wide values); the empty name (the cluster default) lists only the
    dynamic cluster-wide values. Synonyms run source by source (per-broker, cluster default,
    static, default), each over the key's names from its own on (log.retention.ms, .minutes, .hours)."""
    s = ctx.services
    me = str(s.config.node_id)
    if res.resource_name not in (me, ""):
        r.error_code = Errors.INVALID_REQUEST
        r.error_message = f"broker configs of {res.resource_name!r} must be asked of that broker (this is {me})"
        return
    image = s.metadata.image
    cluster = image.configs.get((BROKER_RESOURCE, ""), {})
    if res.resource_name:
        layers = [(image.configs.get((BROKER_RESOURCE, me), {}), DYNAMIC_BROKER_CONFIG),
                  (cluster, DYNAMIC_DEFAULT_BROKER_CONFIG), (s.config.props, STATIC_BROKER_CONFIG),
                  (BROKER_DEFAULTS, DEFAULT_CONFIG)]
    else:
        layers = [(cluster, DYNAMIC_DEFAULT_BROKER_CONFIG)]
    for name in sorted({n for layer, _ in layers for n in layer}):
        if not _wanted(res, name):
            continue
        names = broker_synonyms(name)
        synonyms = _synonyms(names, layers)
        # the key's own value comes first; a value set under another unit's name only follows it
        while synonyms[0].name != name:
            synonyms.pop(0)
        sensitive = is_sensitive(name)
        if sensitive:
            for syn in synonyms:
                syn.value = None
        r.configs.append(
            R.DescribeConfigsResourceResult(
                name=name,
                value=synonyms[0].value,
                read_only=name not in defs.BROKER_CONFIGS and not name.startswith(defs.BROKER_CONFIG_PREFIXES),
                is_default=synonyms[0].source == DEFAULT_CONFIG,
                config_source=synonyms[0].source,
                is_sensitive=sensitive,
                synonyms=synonyms if req.include_synonyms else [],
                config_type=CONFIG_TYPES.get(BROKER_CATALOG.get(name, ("STRING", None))[0], 0),
                documentation=None,
            )
        )


@api(33, 0, 2)
async def alter_configs(ctx: RequestContext, req):
    """As Kafka: log levels change only through IncrementalAlterConfigs."""
    A = AlterConfigsResponse
    return await _split(ctx, req, lambda res: A.AlterConfigsResourceResponse(
        error_code=Errors.INVALID_REQUEST, error_message="AlterConfigs does not support broker loggers: use "
        "IncrementalAlterConfigs", resource_type=res.resource_type, resource_name=res.resource_name), A)


@api(44, 0, 1)
async def incremental_alter_configs(ctx: RequestContext, req):
    """Broker loggers are answered here; the other resources go to the controller."""
    me = ctx.services.config.node_id
    return await _split(ctx, req, lambda res: broker_loggers.alter(res, me, req.validate_only),
                        IncrementalAlterConfigsResponse)


async def _split(ctx: RequestContext, req, local, response_cls):
    loggers = [res for res in req.resources if res.resource_type == broker_loggers.BROKER_LOGGER]
    if not loggers:
        return await ctx.services.forward(req, ctx.api_version)
    answers = [local(res) for res in loggers]
    others = [res for res in req.resources if res.resource_type != broker_loggers.BROKER_LOGGER]
    if not others:
        return response_cls(throttle_time_ms=0, responses=answers)
    req.resources = others
    resp = await ctx.services.forward(req, ctx.api_version)
    resp.responses = list(resp.responses) + answers
    return resp
