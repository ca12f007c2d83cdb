"""`python -m broker --config server.properties`"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

import structlog
import uvloop

from broker.broker import Broker
from broker.cluster_id import ClusterIdMismatch
from broker.config import BrokerConfig
from broker.lifecycle import BrokerIdTaken
from broker.storage import file_cache
from metadata.config_effects import unknown_keys
from node import logging as node_logging
from node.config import ConfigError, NodeConfig
from node.runtime import tune_gc
from node.shutdown import finish_tasks


async def run(config: BrokerConfig) -> int:
    tune_gc()
    broker = Broker(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    lost = broker.lifecycle.lost_event
    starting = asyncio.create_task(broker.start())
    stopper = asyncio.create_task(stop.wait())
    halted = asyncio.create_task(broker.halt.wait())
    await asyncio.wait({starting, stopper, halted}, return_when=asyncio.FIRST_COMPLETED)
    if starting.done() and isinstance(starting.exception(), BrokerIdTaken | ClusterIdMismatch):
        await broker.shutdown(controlled=False)
        await finish_tasks()
        for t in (stopper, halted):
            t.cancel()
        raise starting.exception()  # type: ignore[misc]
    if starting.done() and starting.exception() is not None:
        raise starting.exception()  # type: ignore[misc]
    if not stop.is_set() and not broker.halt.is_set():
        loser = asyncio.create_task(lost.wait())
        await asyncio.wait({stopper, halted, loser}, return_when=asyncio.FIRST_COMPLETED)
        loser.cancel()
    if not starting.done():
        starting.cancel()
    # a broker whose id was taken over leads nothing and must not ask for a controlled shutdown;
    # with every log dir offline there is nothing left to serve, no leadership to hand over in order
    await broker.shutdown(controlled=starting.done() and not lost.is_set() and not broker.halt.is_set())
    await finish_tasks()
    for t in (stopper, halted):
        t.cancel()
    if broker.lifecycle.lost is not None:
        raise broker.lifecycle.lost
    return 1 if broker.halt.is_set() else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m broker", description="Strata broker")
    ap.add_argument("--config", required=True, help="server.properties")
    args = ap.parse_args(argv)
    try:
        cfg = NodeConfig.load(args.config)
        config = BrokerConfig.from_node_config(cfg)
    except ConfigError as e:
        print(f"broker: config error: {e}", file=sys.stderr)
        return 2
    node_logging.configure(cfg.props.get("log.level", "INFO"), node_id=config.node_id, role="broker")
    unknown = unknown_keys(cfg.props)
    if unknown:  # as Kafka's "supplied but isn't a known config": said once, at start
        structlog.get_logger("broker.config").warning("config_keys_unknown", keys=",".join(unknown),
                                                      effect="none: not a Kafka or Strata config")
    try:
        # soft RLIMIT_NOFILE raised to the hard limit, then the storage descriptor budget sized
        file_cache.configure(cfg.props.get("log.open.files.max"))
    except ValueError:
        print(f"broker: config error: log.open.files.max: not an integer: {cfg.props['log.open.files.max']!r}",
              file=sys.stderr)
        return 2
    try:
        return uvloop.run(run(config))
    except BrokerIdTaken as e:
        print(f"broker: {e}", file=sys.stderr)
        return 1
    except ClusterIdMismatch as e:
        print(f"broker: cannot start: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a listener's address in use or not ours
        print(f"broker: cannot start: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    code = main()
    # Every log is closed (and its dir synced) by now: skip the interpreter's teardown, which
    # frees 20,000 partitions' objects one by one for seconds after the broker stopped.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
