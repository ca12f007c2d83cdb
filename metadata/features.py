"""Cluster-wide features (KIP-584) as Strata supports them: what ApiVersions and broker
registration advertise, and which levels UpdateFeatures may finalize. Finalized levels are
FeatureLevelRecords in the metadata log (the image's `features`); metadata.version is fixed at
Strata's own level, which needs no record."""

from __future__ import annotations

from collections.abc import Mapping

from metadata.image import ELR_FEATURE
from protocol.generated.api_versions import ApiVersionsResponse

METADATA_VERSION = "metadata.version"
METADATA_VERSION_LEVEL = 25  # Kafka 4.0-IV3: the record and RPC versions Strata writes and reads

# feature -> (lowest supported level, highest): ApiVersions' SupportedFeatures
SUPPORTED: dict[str, tuple[int, int]] = {
    METADATA_VERSION: (7, METADATA_VERSION_LEVEL),  # 3.3-IV3, the lowest Kafka 4.x reads
    ELR_FEATURE: (0, 1),  # KIP-966: level 1 keeps and elects from eligible leader replicas
}

# UpdateFeatures' UpgradeType values (v1+)
UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE = 1, 2, 3


def finalized(features: Mapping[str, int]) -> dict[str, int]:
    """The finalized levels clients see: metadata.version and every feature at a level above 0
    (a feature at 0 is not finalized, as Kafka drops it)."""
    out = {METADATA_VERSION: METADATA_VERSION_LEVEL}
    out.update({name: level for name, level in features.items() if level > 0 and name != METADATA_VERSION})
    return out


def check_update(name: str, level: int, upgrade_type: int, current: Mapping[str, int]) -> str | None:
    """Why finalizing `name` at `level` is refused (INVALID_UPDATE_VERSION), or None."""
    if name not in SUPPORTED:
        return f"Feature {name!r} is not supported by Strata (supported: {', '.join(sorted(SUPPORTED))})."
    low, high = SUPPORTED[name]
    if name == METADATA_VERSION:
        if level != METADATA_VERSION_LEVEL:
            return f"{METADATA_VERSION} is fixed at {METADATA_VERSION_LEVEL} in Strata; it cannot move to {level}."
        return None
    level = max(level, 0)
    if not low <= level <= high:
        return f"Feature {name} supports levels {low}-{high}, not {level}."
    now = finalized(current).get(name, 0)
    if level < now and upgrade_type == UPGRADE:
        return (f"Feature {name} is finalized at {now}: lowering it to {level} needs a downgrade "
                "(kafka-features.sh downgrade or disable).")
    if upgrade_type not in (UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE):
        return f"Unknown upgrade type {upgrade_type} (1 upgrade, 2 safe downgrade, 3 unsafe downgrade)."
    return None


def advertised(features: Mapping[str, int], api_version: int) -> tuple[list[tuple[str, int, int]],
                                                                       list[tuple[str, int]]]:
    """ApiVersions' (SupportedFeatures, FinalizedFeatures) for a request of `api_version`: (name,
    lowest, highest) and (name, level). Before v4 a feature whose lowest level is 0 is left out
    of the supported list, as Kafka does for older clients."""
    supported = [(name, low, high) for name, (low, high) in sorted(SUPPORTED.items())
                 if api_version >= 4 or low > 0]
    return supported, sorted(finalized(features).items())


def add_features(resp: ApiVersionsResponse, features: Mapping[str, int], offset: int, api_version: int) -> None:
    """ApiVersions v3+'s tagged fields: what this node supports, the finalized levels, and their
    epoch (the metadata offset they were read at, as Kafka)."""
    supported, final = advertised(features, api_version)
    R = ApiVersionsResponse
    resp.supported_features = [R.SupportedFeatureKey(name=n, min_version=lo, max_version=hi) for n, lo, hi in supported]
    resp.finalized_features_epoch = offset
    resp.finalized_features = [R.FinalizedFeatureKey(name=n, max_version_level=lv, min_version_level=lv)
                               for n, lv in final]
