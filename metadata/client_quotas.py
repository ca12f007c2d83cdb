"""Client quota entities and keys, as Kafka defines them (KIP-55, KIP-124, KIP-546).

An entity is a set of (type, name) pairs: `user`, `client-id`, `user`+`client-id`, or `ip` alone;
a None name is that type's default entity. Quotas live in the metadata log as ClientQuotaRecords
(one value of one entity each) and in `MetadataImage.client_quotas` as
{entity: {key: value}}. The controller checks changes with `check_entity` / `check_value`;
brokers resolve and enforce them (broker/quotas/).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

USER, CLIENT_ID, IP = "user", "client-id", "ip"
ENTITY_TYPES = (USER, CLIENT_ID, IP)

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
CONNECTION_CREATION_RATE = "connection_creation_rate"

# key -> whether Kafka types it as a long (whole numbers only); which entities may carry it
CLIENT_KEYS = {PRODUCER_BYTE_RATE: True, CONSUMER_BYTE_RATE: True, REQUEST_PERCENTAGE: False,
               CONTROLLER_MUTATION_RATE: False}
IP_KEYS = {CONNECTION_CREATION_RATE: True}

Entity = tuple[tuple[str, str | None], ...]  # sorted by type


def entity_key(pairs: list[tuple[str, str | None]]) -> Entity:
    return tuple(sorted(pairs, key=lambda p: p[0]))


def describe_entity(entity: Entity) -> str:
    return ",".join(f"{t}={'<default>' if n is None else n}" for t, n in entity) or "<empty>"


def check_entity(pairs: list[tuple[str, str | None]]) -> str | None:
    """Why an entity cannot carry quotas, or None if it can."""
    types = [t for t, _ in pairs]
    if not types:
        return "The quota entity is empty."
    if len(set(types)) != len(types):
        return f"The quota entity names the entity type {sorted(t for t in types if types.count(t) > 1)[0]!r} twice."
    unknown = [t for t in types if t not in ENTITY_TYPES]
    if unknown:
        return f"Unknown quota entity type {unknown[0]!r}: use user, client-id or ip."
    if IP in types and len(types) > 1:
        return "An ip quota entity cannot be combined with user or client-id."
    for t, n in pairs:
        if n == "":
            return f"The {t} entity name is empty (use null for the default entity)."
        if t == IP and n is not None:
            try:
                ipaddress.ip_address(n)
            except ValueError:
                return f"{n!r} is not an IP address."
    return None


def check_value(entity: Entity, key: str, value: float) -> str | None:
    """Why a quota value cannot be set on an entity, or None if it can."""
    keys = IP_KEYS if any(t == IP for t, _ in entity) else CLIENT_KEYS
    if key not in keys:
        return f"Unknown quota key {key!r} for entity {describe_entity(entity)} (known: {', '.join(sorted(keys))})."
    if value != value or value in (float("inf"), float("-inf")):
        return f"Quota {key} must be a finite number."
    if value <= 0:
        return f"Quota {key} must be positive, not {value:g}."
    if keys[key] and value != int(value):
        return f"Quota {key} must be a whole number, not {value:g}."
    return None


def ip_connection_rate(quotas: Mapping[Entity, Mapping[str, float]], ip: str) -> float | None:
    """The connection_creation_rate an IP is held to: its own quota, else the default IP's (Kafka's
    order), else None (unlimited)."""
    for entity in (((IP, ip),), ((IP, None),)):
        rate = quotas.get(entity, {}).get(CONNECTION_CREATION_RATE)
        if rate is not None:
            return rate
    return None
