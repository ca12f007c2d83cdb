"""kafka-features.sh for Strata: describe and change cluster-wide features (KIP-584), as Kafka's
FeatureCommand.

  --bootstrap-server H:P describe
  --bootstrap-server H:P upgrade   --feature NAME=LEVEL [...] | --metadata VERSION   [--dry-run]
  --bootstrap-server H:P downgrade --feature NAME=LEVEL [...] | --metadata VERSION   [--unsafe] [--dry-run]
  --bootstrap-server H:P disable   --feature NAME [...]                              [--unsafe] [--dry-run]

describe prints one line a feature: ``Feature: NAME<TAB>SupportedMinVersion: ..<TAB>
SupportedMaxVersion: ..<TAB>FinalizedVersionLevel: ..<TAB>Epoch: ..`` (metadata.version's levels
as Kafka releases, e.g. 4.0-IV3). A change prints ``NAME was upgraded to LEVEL.`` (``can be`` with
--dry-run); a refused one ``Could not upgrade NAME to LEVEL. REASON`` and exits 1. In Strata only
eligible.leader.replicas.version changes (KIP-966: 1 keeps and elects from eligible leader
replicas); metadata.version is fixed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from metadata.features import METADATA_VERSION, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE, UPGRADE
from protocol.errors import error_message
from protocol.generated.api_versions import ApiVersionsRequest
from protocol.generated.update_features import UpdateFeaturesRequest
from tools.admin import INT16, AdminError, ToolArgumentParser, admin_for, broker_error, run_tool

# MetadataVersion's feature levels and the Kafka releases they name (levels 1-6 predate 4.x's minimum)
RELEASES = {level: name for level, name in enumerate((
    "3.0-IV1", "3.1-IV0", "3.2-IV0", "3.3-IV0", "3.3-IV1", "3.3-IV2", "3.3-IV3", "3.4-IV0", "3.5-IV0", "3.5-IV1",
    "3.5-IV2", "3.6-IV0", "3.6-IV1", "3.6-IV2", "3.7-IV0", "3.7-IV1", "3.7-IV2", "3.7-IV3", "3.7-IV4", "3.8-IV0",
    "3.9-IV0", "4.0-IV0", "4.0-IV1", "4.0-IV2", "4.0-IV3", "4.1-IV0", "4.1-IV1"), start=1)}
LEVELS = {name: level for level, name in RELEASES.items()}
INT16_MAX = INT16[1]


def level_text(feature: str, level: int) -> str:
    return RELEASES.get(level, str(level)) if feature == METADATA_VERSION else str(level)


def metadata_level(text: str) -> int:
    """A --metadata value: a release (4.0-IV3, or 4.0 for its last level) or a feature level."""
    if text in LEVELS:
        return LEVELS[text]
    latest = [lv for name, lv in LEVELS.items() if name.split("-")[0] == text]
    if latest:
        return max(latest)
    if text.isdigit() and 1 <= int(text) <= INT16_MAX:
        return int(text)
    raise AdminError(f"Unknown metadata.version {text!r}: use a release such as 4.0-IV3 or a feature level")


def parse_feature(text: str, with_level: bool) -> tuple[str, int]:
    if not with_level:
        if not text or "=" in text:
            raise AdminError(f"--feature {text!r}: give the feature's name only")
        return text, 0
    name, sep, level = text.partition("=")
    if not sep or not name:
        raise AdminError(f"--feature {text!r}: use NAME=LEVEL")
    if name == METADATA_VERSION:
        return name, metadata_level(level)
    if not level.isdigit() or int(level) > INT16_MAX:
        raise AdminError(f"--feature {text!r}: the level must be a whole number from 0 to {INT16_MAX}")
    return name, int(level)


async def describe(a: argparse.Namespace) -> None:
    async with admin_for(a, a.timeout) as admin:
        resp = await admin.request(ApiVersionsRequest(client_software_name="kafka-features.sh",
                                                       client_software_version="strata"))
    if resp.error_code:
        raise broker_error("ApiVersions failed", resp.error_code)
    finalized = {f.name: f.max_version_level for f in resp.finalized_features or ()}
    epoch = resp.finalized_features_epoch
    for f in sorted(resp.supported_features or (), key=lambda f: f.name):
        level = finalized.get(f.name)
        print(f"Feature: {f.name}\tSupportedMinVersion: {level_text(f.name, f.min_version)}\t"
              f"SupportedMaxVersion: {level_text(f.name, f.max_version)}\t"
              f"FinalizedVersionLevel: {level_text(f.name, level) if level is not None else '-'}\t"
              f"Epoch: {epoch if epoch >= 0 else '-'}")


async def update(a: argparse.Namespace) -> None:
    verb = {"upgrade": "upgrade", "downgrade": "downgrade", "disable": "disable"}[a.command]
    changes = [parse_feature(f, verb != "disable") for f in a.feature or ()]
    if getattr(a, "metadata", None):
        changes.append((METADATA_VERSION, metadata_level(a.metadata)))
    if not changes:
        raise AdminError(f"{verb}: give at least one --feature" + (" or --metadata" if verb != "disable" else ""))
    names = [n for n, _ in changes]
    if len(set(names)) != len(names):
        raise AdminError(f"a feature is named more than once: {', '.join(sorted(n for n in set(names) if names.count(n) > 1))}")
    kind = UPGRADE if verb == "upgrade" else (UNSAFE_DOWNGRADE if a.unsafe else SAFE_DOWNGRADE)
    R = UpdateFeaturesRequest
    req = R(timeout_ms=int(a.timeout * 1000), validate_only=a.dry_run,
            feature_updates=[R.FeatureUpdateKey(feature=n, max_version_level=lv, upgrade_type=kind)
                             for n, lv in changes])
    async with admin_for(a, a.timeout) as admin:
        resp = await admin.request(req, to_controller=True)
    errors = {r.feature: (r.error_code, r.error_message) for r in resp.results or ()}
    failed = 0
    for name, level in changes:
        code, message = errors.get(name, (resp.error_code, resp.error_message))
        target = "" if verb == "disable" else f" to {level_text(name, level)}"
        if code:
            failed += 1
            print(f"Could not {verb} {name}{target}. {' '.join((message or error_message(code)).split())}")
        else:
            done = {"upgrade": "upgraded", "downgrade": "downgraded", "disable": "disabled"}[verb]
            print(f"{name} {'can be' if a.dry_run else 'was'} {done}{target}.")
    if failed:
        raise AdminError(f"{failed} out of {len(changes)} operation(s) failed.")


def build_parser() -> ToolArgumentParser:
    ap = ToolArgumentParser(prog="kafka-features.sh",
                            description="Describe and change cluster-wide features (metadata.version, "
                                        "eligible.leader.replicas.version).")
    ap.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]", help="brokers to connect to")
    ap.add_argument("--timeout", type=float, default=30.0, help=argparse.SUPPRESS)
    sub = ap.add_subparsers(dest="command", required=True, metavar="{describe,upgrade,downgrade,disable}",
                            parser_class=argparse.ArgumentParser)
    sub.add_parser("describe", help="each feature's supported range and finalized level")
    for name, text in (("upgrade", "raise features' finalized levels"), ("downgrade", "lower features' levels"),
                       ("disable", "turn features off (level 0)")):
        p = sub.add_parser(name, help=text)
        p.error = ap.error  # type: ignore[method-assign]  # one clear line and exit 2, as the tool's own errors
        p.add_argument("--feature", action="append", metavar="NAME" if name == "disable" else "NAME=LEVEL",
                       help="a feature and (but for disable) its new level; repeatable")
        if name != "disable":
            p.add_argument("--metadata", metavar="VERSION", help="metadata.version's new level, e.g. 4.0-IV3")
        if name != "upgrade":
            p.add_argument("--unsafe", action="store_true", help="allow a downgrade that may lose metadata")
        p.add_argument("--dry-run", action="store_true", help="check the change without making it")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_tool_args(argv)
    if a.command == "describe":
        return run_tool(describe(a))
    return run_tool(update(a))


if __name__ == "__main__":
    sys.exit(main())
