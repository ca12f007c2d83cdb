"""The controller process: open the metadata, serve the listeners, fence silent brokers, stop
cleanly on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import replace

import structlog

from controller.apis.registry import Apis
from controller.config import ControllerConfig
from controller.controller import Controller, FatalError, NotControllerError
from controller.metrics import collect as controller_metrics
from controller.partition_counts import PartitionDeleter
from controller.server import ControllerServer
from node.metrics import MetricsServer
from node.process_metrics import collect as process_metrics
from node.scram import SCRAM_MECHANISMS, ScramCredential, make_credential

log = structlog.get_logger(__name__)

EXIT_OK = 0
EXIT_FATAL = 1


async def _fencing_loop(apis: Apis) -> None:
    sessions = apis.controller.sessions
    wake = asyncio.Event()
    sessions.on_link_closed = wake.set  # a broker's connection closed: look now, not at the next tick
    while True:
        try:
            await asyncio.wait_for(wake.wait(), sessions.check_interval())
        except TimeoutError:
            pass
        wake.clear()
        if not apis.controller.active:
            continue  # a standby keeps no sessions; the active controller fences
        try:
            await apis.cluster.fence_expired()
        except NotControllerError:
            continue
        except FatalError:
            return
        except Exception:
            log.exception("fencing_check_failed")  # a bug; keep checking rather than never fence


async def _rebalance_loop(apis: Apis) -> None:
    """auto.leader.rebalance.enable: every leader.imbalance.check.interval.seconds, move leaders
    back to their preferred replicas where they can lead."""
    interval = apis.controller.config.leader_imbalance_check_interval_s
    while True:
        await asyncio.sleep(interval)
        if not apis.controller.active:
            continue
        try:
            await apis.partitions.rebalance_leaders()
        except NotControllerError:
            continue
        except FatalError:
            return
        except Exception:
            log.exception("leader_rebalance_failed")


def bootstrap_credentials(entries: tuple[tuple[str, str, str, int], ...]) -> dict[tuple[str, int], ScramCredential]:
    """bootstrap.scram.credentials as SCRAM credentials, by (user, mechanism id)."""
    return {(name, SCRAM_MECHANISMS[mech][0]): make_credential(mech, password, iterations)
            for mech, name, password, iterations in entries}


async def _bootstrap_when_active(apis: Apis, credentials: list) -> None:
    """bootstrap.scram.credentials are written by whichever voter first becomes active."""
    if not credentials:
        return
    while True:
        if apis.controller.active:
            try:
                await apis.scram.bootstrap(credentials)
                return
            except NotControllerError:
                pass
        await asyncio.sleep(0.05)


async def _elr_when_active(apis: Apis) -> None:
    """eligible.leader.replicas.enable: whichever voter is active turns KIP-966's feature on."""
    while True:
        if apis.controller.active:
            try:
                await apis.configs.enable_elr()
                return
            except NotControllerError:
                pass
        await asyncio.sleep(0.05)


async def run(config: ControllerConfig) -> int:
    """Runs until a signal (exit 0) or a fatal error (exit 1). Start-up errors propagate."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    exit_code = EXIT_OK

    def on_fatal(_exc: BaseException) -> None:
        nonlocal exit_code
        exit_code = EXIT_FATAL
        stop.set()

    controller = Controller(config)
    controller.on_fatal = on_fatal
    # Blocking start-up work runs before anything is served, so it holds up no one.
    report = controller.open()
    if config.single_voter:
        # A quorum of one elects itself: be active before listening, so the first request finds
        # a serving controller, as before the quorum existed.
        controller.start()
        await controller.wait_active()
        if controller.fatal_error is not None:
            await controller.close()
            return EXIT_FATAL
    apis = Apis.create(controller)
    single = config.single_voter
    if single:
        await apis.scram.bootstrap(list(config.bootstrap_scram))
    server = ControllerServer(apis, config.max_request_bytes)
    bootstrapped = bootstrap_credentials(config.bootstrap_scram)

    def scram_lookup(user: str, mechanism: int) -> ScramCredential | None:
        # The configured bootstrap credentials count until the metadata holds credentials: the
        # voters of a new quorum authenticate to each other with them to elect the leader that
        # writes them (Kafka's format step puts them in every voter's bootstrap snapshot). Once
        # written, only the metadata counts (a deleted user stays deleted).
        scram = controller.image.scram
        return scram.get((user, mechanism)) if scram else bootstrapped.get((user, mechanism))

    # the metrics endpoint first: a scraper (or a test) that waits for the client listeners then
    # finds /metrics up too, as on brokers
    metrics = None
    if config.metrics_listener is not None:
        metrics = MetricsServer([process_metrics, server.request_metrics.families,
                                 lambda: controller_metrics(controller.image, controller.active)])
        try:
            await metrics.start(*config.metrics_listener)
        except OSError:
            controller.log.close()
            raise
    bound = []
    try:
        for e, sec in zip(config.listeners, config.securities, strict=True):
            if sec.sasl is not None:
                sec = replace(sec, sasl=replace(sec.sasl, scram_lookup=scram_lookup))
            port = await server.start(e.host, e.port, sec)
            bound.append(f"{e.listener}://{e.host}:{port} ({sec.protocol})")
    except OSError as e:
        await server.stop()
        if metrics is not None:
            await metrics.stop()
        controller.log.close()
        where = ",".join(str(x) for x in config.listeners)
        raise OSError(f"cannot listen on {where}: {e.strerror or e}") from None
    if not single:
        controller.start()  # the other voters must reach our listener to elect anyone
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    deleter = PartitionDeleter(controller)
    bootstrap = loop.create_task(_bootstrap_when_active(apis, [] if single else list(config.bootstrap_scram)))
    background = [
        bootstrap,
        loop.create_task(_fencing_loop(apis)),
        loop.create_task(deleter.run(config.partition_deletion_check_interval_ms / 1000)),
    ]
    if config.auto_leader_rebalance:
        background.append(loop.create_task(_rebalance_loop(apis)))
    if config.eligible_leader_replicas:
        background.append(loop.create_task(_elr_when_active(apis)))
    log.info("controller_started", listeners=",".join(bound), **report)
    await stop.wait()
    log.info("controller_stopping", exit_code=exit_code)
    for task in background:
        task.cancel()
    if metrics is not None:
        await metrics.stop()
    await server.stop()
    await controller.close()
    log.info("controller_stopped")
    return exit_code
