"""UpdateFeatures (KIP-584, KIP-778): finalize a cluster-wide feature's level. Strata's changeable
feature is KIP-966's eligible.leader.replicas.version; metadata.version is fixed (metadata.features).
As Kafka's FeatureControlManager, the request is all or nothing: one refused update refuses them all."""

from __future__ import annotations

from controller.apis.registry import Apis
from controller.replication import ELR_FEATURE
from metadata.features import SAFE_DOWNGRADE, UPGRADE, check_update
from protocol.errors import Errors
from protocol.generated.update_features import UpdateFeaturesRequest, UpdateFeaturesResponse
from protocol.headers import Request


async def update_features(apis: Apis, req: Request) -> UpdateFeaturesResponse:
    body = req.body
    current = apis.controller.image.features  # a feature at level 0 is absent or 0: not finalized either way
    wanted: list[tuple[str, int]] = []
    refusal: str | None = None
    for u in body.feature_updates:
        level = max(u.max_version_level, 0)
        if req.api_version >= 1:
            kind = u.upgrade_type
        else:
            kind = SAFE_DOWNGRADE if u.allow_downgrade else UPGRADE
        why = check_update(u.feature, level, kind, current)
        if why is None and any(name == u.feature for name, _ in wanted):
            why = f"Feature {u.feature} appears more than once."
        if why is None and u.feature == ELR_FEATURE and level == 0 and current.get(ELR_FEATURE, 0) > 0 \
                and apis.controller.config.eligible_leader_replicas:
            why = (f"The controllers' eligible.leader.replicas.enable=true would turn {ELR_FEATURE} on again at "
                   "the next failover: set it to false on every controller first.")
        refusal = refusal or why
        wanted.append((u.feature, level))
    validate_only = req.api_version >= 1 and body.validate_only
    if refusal is None and not validate_only:
        for name, level in wanted:
            if name == ELR_FEATURE and level != current.get(ELR_FEATURE, 0):
                await (apis.configs.enable_elr() if level >= 1 else apis.configs.disable_elr())
    R = UpdateFeaturesResponse
    code = Errors.INVALID_UPDATE_VERSION if refusal else 0
    return R(throttle_time_ms=0, error_code=code, error_message=refusal,
             results=[R.UpdatableFeatureResult(feature=name, error_code=code, error_message=refusal)
                      for name, _ in wanted])


HANDLERS = {
    57: (UpdateFeaturesRequest.MIN_VERSION, UpdateFeaturesRequest.MAX_VERSION, update_features),
}
