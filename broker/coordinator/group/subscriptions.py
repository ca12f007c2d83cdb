"""What a consumer group's members subscribe to, resolved against the metadata image: topic
names and server-side regular expressions (KIP-848, "Regular Expressions") to topic ids, with
each topic's partition count and its partitions' replica racks (for rack-aware assignors).

Patterns are RE2/J's syntax, as Kafka's: matched against the whole topic name, never against
internal topics. Python's `re` runs them; the RE2 constructs it lacks are refused here so a
pattern means the same on Strata as on Kafka, and one that does not compile is
INVALID_REGULAR_EXPRESSION.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from uuid import UUID

from broker.coordinator.group.assignors import TopicSpec
from metadata.image import MetadataImage

# constructs RE2 does not have (lookaround, backreferences, atomic groups, possessive and
# conditional forms): a pattern using them does not compile on Kafka either
_NOT_RE2 = re.compile(r"\(\?[=!]|\(\?<[=!]|\(\?>|\(\?\(|\\[1-9]|\(\?P=|[*+?}][+]")
MAX_REGEX_LENGTH = 4096  # Kafka bounds no more than the request size; this keeps matching cheap


class InvalidRegex(ValueError):
    pass


def compile_regex(pattern: str) -> re.Pattern[str]:
    if len(pattern) > MAX_REGEX_LENGTH:
        raise InvalidRegex(f"the regular expression is longer than {MAX_REGEX_LENGTH} characters")
    if _NOT_RE2.search(pattern):
        raise InvalidRegex(f"{pattern!r} uses a construct RE2/J does not support")
    try:
        return re.compile(pattern)
    except re.error as e:
        raise InvalidRegex(f"{pattern!r} does not compile: {e}") from None


def is_internal(name: str) -> bool:
    return name.startswith("__")


def resolve(image: MetadataImage, names: Iterable[str], regexes: Iterable[str]) -> dict[UUID, str]:
    """Topic id -> name of every existing topic the names and patterns subscribe to."""
    out: dict[UUID, str] = {}
    for n in names:
        tid = image.topic_ids.get(n)
        if tid is not None:
            out[tid] = n
    patterns = []
    for r in set(regexes):
        try:
            patterns.append(compile_regex(r))
        except InvalidRegex:
            continue  # refused when the member sent it; never stored
    if patterns:
        for name, tid in image.topic_ids.items():
            if not is_internal(name) and any(p.fullmatch(name) for p in patterns):
                out[tid] = name
    return out


def topic_specs(image: MetadataImage, topic_ids: Iterable[UUID]) -> dict[UUID, TopicSpec]:
    """Partition counts and replica racks. Every partition of the image is assigned, those of a
    KIP-253 count change still draining and inactive chunks alike: a partition is one unit."""
    specs: dict[UUID, TopicSpec] = {}
    brokers = image.brokers
    for tid in topic_ids:
        t = image.topics.get(tid)
        if t is None or not t.partitions:
            continue
        racks = {}
        for p, info in t.partitions.items():
            rs = frozenset(b.rack for r in info.replicas if (b := brokers.get(r)) is not None and b.rack)
            if rs:
                racks[p] = rs
        specs[tid] = TopicSpec(max(t.partitions) + 1, racks)
    return specs
