"""BROKER_LOGGER config resources (type 8), as Kafka's: DescribeConfigs lists this broker's
loggers with their levels; IncrementalAlterConfigs sets (SET) a logger's level or lets it
inherit its parent's again (DELETE). Answered by the broker named, never forwarded: levels are
this process's, not metadata (Kafka keeps them out of the metadata log too, and a restart
forgets them)."""

from __future__ import annotations

from node import logging as node_logging
from protocol.errors import Errors
from protocol.generated.describe_configs import DescribeConfigsResponse
from protocol.generated.incremental_alter_configs import IncrementalAlterConfigsResponse

BROKER_LOGGER = 8
DYNAMIC_BROKER_LOGGER_CONFIG = 6  # Kafka's ConfigSource
STRING_TYPE = 2
OP_SET, OP_DELETE = 0, 1


def _wrong_broker(name: str, node_id: int) -> str | None:
    if name != str(node_id):
        return f"Unexpected broker id, expected {node_id}, but received {name}"
    return None


def describe(res, node_id: int, r: DescribeConfigsResponse.DescribeConfigsResult) -> None:
    R = DescribeConfigsResponse
    why = _wrong_broker(res.resource_name, node_id)
    if why:
        r.error_code, r.error_message = Errors.INVALID_REQUEST, why
        return
    for name, level in node_logging.logger_levels().items():
        if res.configuration_keys is None or name in res.configuration_keys:
            r.configs.append(R.DescribeConfigsResourceResult(
                name=name, value=level, read_only=False, is_default=False,
                config_source=DYNAMIC_BROKER_LOGGER_CONFIG, is_sensitive=False, synonyms=[],
                config_type=STRING_TYPE, documentation=None))


def alter(res, node_id: int, validate_only: bool) -> IncrementalAlterConfigsResponse.AlterConfigsResourceResponse:
    """Check every change of the resource first; apply them all or none."""
    A = IncrementalAlterConfigsResponse.AlterConfigsResourceResponse
    out = A(resource_type=BROKER_LOGGER, resource_name=res.resource_name, error_code=0, error_message=None)
    why = _wrong_broker(res.resource_name, node_id) or _check(res.configs)
    if why:
        out.error_code, out.error_message = why if isinstance(why, tuple) else (Errors.INVALID_REQUEST, why)
        return out
    if not validate_only:
        for c in res.configs:
            level = node_logging.LEVELS[c.value.upper()] if c.config_operation == OP_SET else None
            node_logging.levels.set(c.name, level)
    return out


def _check(configs) -> tuple[int, str] | None:
    known = node_logging.logger_levels()
    for c in configs:
        if c.config_operation not in (OP_SET, OP_DELETE):
            return Errors.INVALID_REQUEST, f"Operation {c.config_operation} is not supported for broker loggers"
        if c.name not in known:
            return Errors.INVALID_CONFIG, f"Logger {c.name} does not exist!"
        if c.config_operation == OP_DELETE and c.name == node_logging.ROOT:
            return Errors.INVALID_REQUEST, "Removing the log level of the root logger is not allowed"
        if c.config_operation == OP_SET and (c.value or "").upper() not in node_logging.LEVELS:
            return Errors.INVALID_CONFIG, (
                f"Cannot set the log level of {c.name} to {c.value} as it is not a supported log level. "
                f"Valid levels are {', '.join(node_logging.LEVELS)}")
    return None
