"""Names the controller and the brokers share about diskless topics."""

from __future__ import annotations

from collections.abc import Mapping

DISKLESS_ENABLE = "diskless.enable"  # topic config, set at creation only
DISKLESS_METADATA_TOPIC = "__diskless_metadata"  # the diskless coordinators' log


def is_diskless(topic_configs: Mapping[str, str]) -> bool:
    return str(topic_configs.get(DISKLESS_ENABLE, "false")).strip().lower() == "true"
