"""DescribeClientQuotas' filter over the image's quota entities, as Kafka's ClientQuotasImage:
exact-name, default and any-name components, strict or not."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from metadata.client_quotas import CLIENT_ID, ENTITY_TYPES, IP, USER, Entity
from protocol.errors import Errors

MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY = 0, 1, 2


class FilterError(Exception):
    def __init__(self, code: int, message: str) -> None:
        self.code = code
        super().__init__(message)


def matching(quotas: Mapping[Entity, Mapping[str, float]], components: list[Any], strict: bool
             ) -> list[tuple[Entity, Mapping[str, float]]]:
    """The (entity, values) that `components` (DescribeClientQuotasRequest.ComponentData) match."""
    exact: dict[str, str | None] = {}
    any_name: set[str] = set()
    for c in components:
        t = c.entity_type
        if not t:
            raise FilterError(Errors.INVALID_REQUEST, "Invalid empty entity type.")
        if t in exact or t in any_name:
            raise FilterError(Errors.INVALID_REQUEST, f"Entity type {t} cannot appear more than once in the filter.")
        if t not in ENTITY_TYPES:
            raise FilterError(Errors.UNSUPPORTED_VERSION, f"Unsupported entity type {t}.")
        if c.match_type == MATCH_EXACT:
            if c.match is None:
                raise FilterError(Errors.INVALID_REQUEST, "An exact match needs a name to match.")
            exact[t] = c.match
        elif c.match_type in (MATCH_DEFAULT, MATCH_ANY):
            if c.match is not None:
                raise FilterError(Errors.INVALID_REQUEST, "Only an exact match takes a name to match.")
            if c.match_type == MATCH_DEFAULT:
                exact[t] = None
            else:
                any_name.add(t)
        else:
            raise FilterError(Errors.INVALID_REQUEST, f"Unknown match type {c.match_type}.")
    named = set(exact) | any_name
    if IP in named and named & {USER, CLIENT_ID}:
        raise FilterError(Errors.INVALID_REQUEST, "An ip filter component cannot be combined with user or client-id.")
    out = []
    for entity, values in quotas.items():
        names = dict(entity)
        if strict and len(names) != len(named):
            continue
        if all(t in names and names[t] == n for t, n in exact.items()) and all(t in names for t in any_name):
            out.append((entity, values))
    out.sort(key=lambda ev: repr(ev[0]))
    return out
