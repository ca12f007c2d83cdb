"""IncrementalAlterConfigs and AlterConfigs for topics (resource type 2), brokers (4) and
KIP-848 groups (32: a group id, which need not exist yet, as Kafka).

A broker resource is a broker id, or the empty name for the cluster-wide default. Each request
is one operation: resources that pass validation are written together as ConfigRecords (a null
value deletes the key); the others get their error. Other resource types (broker loggers,
client metrics) are not the controller's: INVALID_REQUEST.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from controller.controller import Batch, Controller
from controller.errors import ApiError, Errors
from controller.replication import ELR_FEATURE, MIN_ISR, clear_elr, elr_enabled
from metadata import config_defs, config_effects
from metadata.diskless import DISKLESS_ENABLE, is_diskless
from metadata.image import BROKER_RESOURCE, CLIENT_METRICS_RESOURCE, GROUP_RESOURCE, TOPIC_RESOURCE, MetadataImage
from protocol.generated.metadata_records.config_record import ConfigRecord
from protocol.generated.metadata_records.feature_level_record import FeatureLevelRecord

log = structlog.get_logger(__name__)

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


@dataclass
class ResourceResult:
    resource_type: int
    resource_name: str
    error: ApiError | None = None


def _check_resource(image: MetadataImage, rtype: int, name: str) -> None:
    if rtype == TOPIC_RESOURCE:
        if name not in image.topic_ids:
            raise ApiError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"Topic '{name}' does not exist.")
    elif rtype == BROKER_RESOURCE:
        if name != "" and not (name.isdigit() and int(name) < 2**31):
            raise ApiError(
                Errors.INVALID_REQUEST,
                f"Broker resource name {name!r} is not a broker id; use a number, or '' for the cluster default.",
            )
    elif rtype == GROUP_RESOURCE:
        if not name:
            raise ApiError(Errors.INVALID_REQUEST, "A group config needs a group id.")
    elif rtype == CLIENT_METRICS_RESOURCE:
        if not name:
            raise ApiError(Errors.INVALID_REQUEST, "A client metrics subscription needs a name.")
    else:
        raise ApiError(
            Errors.INVALID_REQUEST,
            f"Resource type {rtype} is not handled by the controller (only topics (2), brokers (4), "
            "client metrics (16) and groups (32)).",
        )


def _validate(rtype: int, name: str, value: str, props: Mapping[str, str]) -> None:
    try:
        if rtype == TOPIC_RESOURCE:
            config_defs.validate_topic_config(name, value)
        elif rtype == GROUP_RESOURCE:
            config_defs.validate_group_config(name, value, props)  # within the group.consumer.* bounds
        elif rtype == CLIENT_METRICS_RESOURCE:
            config_defs.validate_client_metrics_config(name, value)
        else:
            config_defs.validate_broker_config(name, value)
    except config_defs.ConfigValueError as e:
        raise ApiError(Errors.INVALID_CONFIG, str(e)) from None
    why = config_effects.refusal(name, value) if rtype in (TOPIC_RESOURCE, BROKER_RESOURCE) else None
    if why is not None:  # a key Strata cannot obey at this value: refused, never stored without effect
        raise ApiError(Errors.INVALID_CONFIG, why)


def _records(rtype: int, rname: str, current: dict[str, str], wanted: dict[str, str | None]) -> list[ConfigRecord]:
    out = []
    for k, v in wanted.items():
        # Topic keys that do not change are not rewritten; broker keys always are, so brokers
        # reload them (Kafka does the same).
        if rtype == TOPIC_RESOURCE and current.get(k) == v:
            continue
        if v is None and k not in current:
            continue
        out.append(ConfigRecord(resource_type=rtype, resource_name=rname, name=k, value=v))
    return out


def _elr_check(image: MetadataImage, rtype: int, rname: str, wanted: dict[str, str | None]) -> None:
    """With ELR on, min.insync.replicas lives at the cluster level only, so every node reads one
    value (Kafka's ConfigurationControlManager refuses the other two changes too)."""
    if not elr_enabled(image) or rtype != BROKER_RESOURCE or MIN_ISR not in wanted:
        return
    if rname:
        raise ApiError(Errors.INVALID_CONFIG,
                       f"Broker-level {MIN_ISR} cannot be altered while ELR is enabled (set it for the cluster).")
    if wanted[MIN_ISR] is None:
        raise ApiError(Errors.INVALID_CONFIG, f"Cluster-level {MIN_ISR} cannot be removed while ELR is enabled.")


class ConfigControl:
    def __init__(self, controller: Controller) -> None:
        self.ctl = controller

    async def enable_elr(self) -> list[str]:
        """Turn KIP-966's eligible leader replicas on, with the records that make it safe (Kafka's
        maybeGenerateElrSafetyRecords) in the same batch, ahead of the feature record: the
        cluster-level min.insync.replicas set from this controller's static value when absent,
        every broker-level one removed. Nothing when already on. Returns what was written."""
        def build(image: MetadataImage, batch: Batch) -> list[str]:
            if elr_enabled(image):
                return []
            done = []
            if MIN_ISR not in image.configs.get((BROKER_RESOURCE, ""), {}):
                value = str(int(self.ctl.config.static.get(MIN_ISR) or 1))
                batch.add(ConfigRecord(resource_type=BROKER_RESOURCE, resource_name="", name=MIN_ISR, value=value))
                done.append(f"cluster {MIN_ISR}={value}")
            for (rtype, rname), cfg in sorted(image.configs.items()):
                if rtype == BROKER_RESOURCE and rname and MIN_ISR in cfg:
                    batch.add(ConfigRecord(resource_type=BROKER_RESOURCE, resource_name=rname, name=MIN_ISR,
                                           value=None))
                    done.append(f"broker {rname} {MIN_ISR} removed")
            batch.add(FeatureLevelRecord(name=ELR_FEATURE, feature_level=1))
            done.append(f"{ELR_FEATURE}=1")
            return done

        done = await self.ctl.write(build)
        if done:
            log.info("elr_enabled", records=", ".join(done))
        return done

    async def disable_elr(self) -> list[str]:
        """Turn KIP-966's eligible leader replicas off (a downgrade of its feature to 0): every
        partition's ELR and last known ELR cleared in the batch that writes the feature's level,
        so no election trusts them again. Nothing when already off. Returns what was written."""
        def build(image: MetadataImage, batch: Batch) -> list[str]:
            if not elr_enabled(image):
                return []
            cleared = clear_elr(image, None)
            for record in cleared:
                batch.add(record)
            batch.add(FeatureLevelRecord(name=ELR_FEATURE, feature_level=0))
            return [f"ELR cleared on {len(cleared)} partitions", f"{ELR_FEATURE}=0"]

        done = await self.ctl.write(build)
        if done:
            log.info("elr_disabled", records=", ".join(done))
        return done

    async def incremental_alter(self, resources: list[Any], validate_only: bool) -> list[ResourceResult]:
        """`resources` are IncrementalAlterConfigsRequest.AlterConfigsResource entries."""
        return await self._alter(resources, validate_only, incremental=True)

    async def alter(self, resources: list[Any], validate_only: bool) -> list[ResourceResult]:
        """Legacy AlterConfigs: the given set replaces the resource's whole config."""
        return await self._alter(resources, validate_only, incremental=False)

    async def _alter(self, resources: list[Any], validate_only: bool, incremental: bool) -> list[ResourceResult]:
        def build(image: MetadataImage, batch: Batch) -> list[ResourceResult]:
            counts = Counter((r.resource_type, r.resource_name) for r in resources)
            out = []
            records: list[ConfigRecord] = []
            for r in resources:
                res = ResourceResult(r.resource_type, r.resource_name)
                out.append(res)
                try:
                    if counts[(r.resource_type, r.resource_name)] > 1:
                        raise ApiError(Errors.INVALID_REQUEST, "The resource appears more than once in the request.")
                    _check_resource(image, r.resource_type, r.resource_name)
                    current = dict(image.configs.get((r.resource_type, r.resource_name), {}))
                    wanted = self._incremental(r, current) if incremental else self._replace(r, current)
                    if r.resource_type == TOPIC_RESOURCE and DISKLESS_ENABLE in wanted and is_diskless(
                            {DISKLESS_ENABLE: wanted[DISKLESS_ENABLE] or "false"}) != is_diskless(current):
                        raise ApiError(Errors.INVALID_CONFIG,
                                       f"{DISKLESS_ENABLE} is set when a topic is created and cannot change.")
                    _elr_check(image, r.resource_type, r.resource_name, wanted)
                    records.extend(_records(r.resource_type, r.resource_name, current, wanted))
                except ApiError as e:
                    res.error = e
            if not validate_only:
                batch.extend(records)
                if elr_enabled(image):
                    for rec in records:
                        if rec.name == MIN_ISR and (rec.resource_type == TOPIC_RESOURCE or rec.resource_name == ""):
                            batch.extend(clear_elr(image, rec.resource_name or None))
            return out

        results = await self.ctl.write(build)
        log.info(
            "alter_configs",
            incremental=incremental,
            validate_only=validate_only,
            results=", ".join(
                f"{r.resource_type}/{r.resource_name}:{r.error.code if r.error else 'OK'}" for r in results
            ),
        )
        return results

    @staticmethod
    def _dup_check(names: list[str]) -> None:
        dup = [n for n, k in Counter(names).items() if k > 1]
        if dup:
            raise ApiError(Errors.INVALID_REQUEST, f"Config {dup[0]} appears more than once for this resource.")

    def _incremental(self, r: Any, current: dict[str, str]) -> dict[str, str | None]:
        self._dup_check([c.name for c in r.configs])
        wanted: dict[str, str | None] = {}
        for c in r.configs:
            op = c.config_operation
            if op == DELETE:
                wanted[c.name] = None
                continue
            if op not in (SET, APPEND, SUBTRACT):
                raise ApiError(Errors.INVALID_REQUEST, f"Unknown config operation {op} for {c.name}.")
            if c.value is None:
                raise ApiError(Errors.INVALID_REQUEST, f"Null value not supported for config {c.name}.")
            value = c.value
            if op in (APPEND, SUBTRACT):
                if config_defs.config_type(r.resource_type, c.name) != "LIST":
                    raise ApiError(
                        Errors.INVALID_CONFIG,
                        f"Config {c.name} is not a list, so values cannot be appended or subtracted.",
                    )
                # Kafka appends to (or subtracts from) the default when the key is not set yet.
                base = current.get(c.name)
                if base is None:
                    base = config_defs.default_value(r.resource_type, c.name) or ""
                have = [x.strip() for x in base.split(",") if x.strip()]
                items = [x.strip() for x in value.split(",") if x.strip()]
                if op == APPEND:
                    have += [x for x in items if x not in have]
                else:
                    have = [x for x in have if x not in items]
                value = ",".join(have)
                if op == SUBTRACT and not have:
                    wanted[c.name] = None
                    continue
            _validate(r.resource_type, c.name, value, self.ctl.config.static)
            wanted[c.name] = value
        return wanted

    def _replace(self, r: Any, current: dict[str, str]) -> dict[str, str | None]:
        self._dup_check([c.name for c in r.configs])
        wanted: dict[str, str | None] = {}
        for c in r.configs:
            if c.value is None:
                raise ApiError(Errors.INVALID_REQUEST, f"Null value not supported for config {c.name}.")
            _validate(r.resource_type, c.name, c.value, self.ctl.config.static)
            wanted[c.name] = c.value
        for k in current:
            if k not in wanted:
                wanted[k] = None
        return wanted
