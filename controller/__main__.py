"""python -m controller --config server.properties"""

from __future__ import annotations

import argparse
import os
import sys

import structlog
import uvloop

from controller.config import ControllerConfig
from controller.log_dirs import StartupError
from metadata.config_effects import unknown_keys
from node.config import ConfigError, NodeConfig
from node.logging import configure
from node.runtime import tune_gc

EXIT_BAD_CONFIG = 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controller", description="Run the Strata controller.")
    parser.add_argument("--config", required=True, help="path to server.properties")
    args = parser.parse_args(argv)
    try:
        config = ControllerConfig.from_node_config(NodeConfig.load(args.config))
    except ConfigError as e:
        print(f"controller: bad config {args.config}: {e}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    configure(os.environ.get("STRATA_LOG_LEVEL", "INFO"), node_id=config.node_id, role="controller")
    unknown = unknown_keys(config.static)
    if unknown:  # as Kafka's "supplied but isn't a known config": said once, at start
        structlog.get_logger("controller.config").warning("config_keys_unknown", keys=",".join(unknown),
                                                          effect="none: not a Kafka or Strata config")
    from controller.app import run  # after logging is configured

    tune_gc()
    try:
        return uvloop.run(run(config))
    except StartupError as e:
        print(f"controller: cannot start: {e}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    except OSError as e:
        print(f"controller: cannot start: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
