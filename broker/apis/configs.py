"""DescribeConfigs from the image (topic overrides, this broker's properties, Kafka's defaults);
AlterConfigs and IncrementalAlterConfigs are forwarded to the controller."""

from __future__ import annotations

from broker.apis import RequestContext, api
from metadata import config_defs as defs
from metadata.image import BROKER_RESOURCE, TOPIC_RESOURCE
from protocol.errors import Errors
from protocol.generated.describe_configs import DescribeConfigsResponse

R = DescribeConfigsResponse
# Kafka's ConfigSource and ConfigType numbers.
DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG = 1, 2, 3
STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 4, 5
CONFIG_TYPES = {"BOOLEAN": 1, "STRING": 2, "INT": 3, "LONG": 5, "DOUBLE": 6, "LIST": 7}
SENSITIVE = ("password", "secret", "sasl.jaas")


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
        else:
            r.error_code = Errors.INVALID_REQUEST
            r.error_message = f"resource type {res.resource_type} is not supported"
    return R(results=results)


def _wanted(res, name: str) -> bool:
    return res.configuration_keys is None or name in res.configuration_keys


def _topic(ctx: RequestContext, req, res, r) -> None:
    b = ctx.broker
    image = b.metadata.image
    if image.topic(res.resource_name) is None:
        r.error_code = Errors.UNKNOWN_TOPIC_OR_PARTITION
        r.error_message = f"topic '{res.resource_name}' does not exist"
        return
    explicit = image.topic_config(res.resource_name)
    cluster = image.configs.get((BROKER_RESOURCE, ""), {})
    for name, value, source in defs.effective_topic_configs(explicit, cluster, b.config.props):
        if not _wanted(res, name):
            continue
        d = defs.TOPIC_CONFIGS[name]
        synonyms = []
        if name in explicit:
            synonyms.append(R.DescribeConfigsSynonym(name=name, value=explicit[name], source=DYNAMIC_TOPIC_CONFIG))
        for props, src in ((cluster, DYNAMIC_DEFAULT_BROKER_CONFIG), (b.config.props, STATIC_BROKER_CONFIG)):
            for syn, _ in d.synonyms:
                if syn in props:
                    synonyms.append(R.DescribeConfigsSynonym(name=syn, value=props[syn], source=src))
        synonyms.append(
            R.DescribeConfigsSynonym(
                name=d.synonyms[0][0] if d.synonyms else name, value=d.default, source=DEFAULT_CONFIG
            )
        )
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
            )
        )


def _broker(ctx: RequestContext, req, res, r) -> None:
    b = ctx.broker
    me = str(b.config.node_id)
    if res.resource_name not in (me, ""):
        r.error_code = Errors.INVALID_REQUEST
        r.error_message = f"broker configs of {res.resource_name!r} must be asked of that broker (this is {me})"
        return
    image = b.metadata.image
    layers = [
        (image.configs.get((BROKER_RESOURCE, me), {}) if res.resource_name else {}, DYNAMIC_BROKER_CONFIG),
        (image.configs.get((BROKER_RESOURCE, ""), {}), DYNAMIC_DEFAULT_BROKER_CONFIG),
        (b.config.props, STATIC_BROKER_CONFIG),
    ]
    names = sorted({n for layer, _ in layers for n in layer})
    for name in names:
        if not _wanted(res, name):
            continue
        synonyms = [
            R.DescribeConfigsSynonym(name=name, value=layer[name], source=src) for layer, src in layers if name in layer
        ]
        sensitive = any(s in name for s in SENSITIVE)
        r.configs.append(
            R.DescribeConfigsResourceResult(
                name=name,
                value=None if sensitive else synonyms[0].value,
                read_only=synonyms[0].source == STATIC_BROKER_CONFIG,
                is_default=False,
                config_source=synonyms[0].source,
                is_sensitive=sensitive,
                synonyms=synonyms if req.include_synonyms else [],
                config_type=CONFIG_TYPES["STRING"],
            )
        )


@api(33, 0, 2)
async def alter_configs(ctx: RequestContext, req):
    return await ctx.broker.forward(req, ctx.api_version)


@api(44, 0, 1)
async def incremental_alter_configs(ctx: RequestContext, req):
    return await ctx.broker.forward(req, ctx.api_version)
