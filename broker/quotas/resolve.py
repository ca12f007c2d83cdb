"""Which configured quota applies to a (user, client-id), per quota key, in Kafka's order of
precedence: the most specific user+client-id entity first, then user, then client-id alone
(KIP-55), defaults (a None name) after exact names at each level."""

from __future__ import annotations

from collections.abc import Mapping

from metadata.client_quotas import CLIENT_ID, USER, Entity

ANONYMOUS = "ANONYMOUS"  # the principal of a PLAINTEXT connection, as Kafka names it


def _candidates(user: str, client_id: str) -> list[Entity]:
    u, c, du, dc = (USER, user), (CLIENT_ID, client_id), (USER, None), (CLIENT_ID, None)
    # tuples are sorted by type: client-id before user
    return [(c, u), (dc, u), (u,), (c, du), (dc, du), (du,), (c,), (dc,)]


def resolve(quotas: Mapping[Entity, Mapping[str, float]], key: str, user: str, client_id: str
            ) -> tuple[Entity, float] | None:
    """(the bucket, the bound) of the quota `key` for this client, or None when none applies.

    The bucket is the matching entity with each default name replaced by the client's own: all
    clients matching an exact entity share one budget, while a default gives each its own (as
    Kafka's quota metric tags do)."""
    if not quotas:
        return None
    for entity in _candidates(user, client_id):
        values = quotas.get(entity)
        if values is not None and key in values:
            bucket = tuple((t, user if t == USER else client_id) for t, _ in entity)
            return bucket, values[key]
    return None
