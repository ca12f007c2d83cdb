"""The acceptance scenarios on a cluster whose every listener is SASL_SSL with SCRAM-SHA-512 and
the authorizer on (the nodes and the clients' "admin" are super users):
clients, follower fetches, the brokers' registration, heartbeats and metadata fetches, transaction
markers and chunk copies all go over TLS, authenticated (the nodes as user "broker"). The
scenarios are the existing tests' own, run with this cluster."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import test_chunks_data, test_replication, test_transactions
from tools.cluster import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def secure3(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "c", brokers=3, verbose=False, secure="SASL_SSL", acls=True,
                broker_overrides={**test_chunks_data.FAST, **test_replication.FAST, **test_transactions.BROKER},
                controller_overrides={"broker.session.timeout.ms": "3000"})
    try:
        c.start()
        yield c
    finally:
        c.stop()


def _inter_node_traffic_was_authenticated(c: Cluster) -> None:
    ctl = Path(c.log_path("controller")).read_text()
    assert "principal='User:broker'" in ctl and "listener='CONTROLLER'" in ctl
    for b in c.broker_ids:
        text = Path(c.log_path(b)).read_text()
        assert "sasl_authentication_failed" not in text and "Traceback" not in text


def test_replication_data_survives_any_one_broker_kill(secure3: Cluster) -> None:
    test_replication.test_data_survives_any_one_broker_kill(secure3)
    _inter_node_traffic_was_authenticated(secure3)
    # followers fetched from leaders as "broker" over TLS
    assert any("principal='User:broker'" in Path(secure3.log_path(b)).read_text() for b in secure3.broker_ids)


def test_chunks_seed_non_transactional(secure3: Cluster) -> None:
    test_chunks_data.test_seed_non_transactional(secure3, "rdkafka")
    _inter_node_traffic_was_authenticated(secure3)


def test_chunks_and_transactions_seed_transactional(secure3: Cluster) -> None:
    """A transaction left open across a chunk cut: the new chunk's leader copies it from the old
    chunk's replica (broker to broker), the commit's markers go out (broker to broker)."""
    test_chunks_data.test_seed_transactional(secure3)
    _inter_node_traffic_was_authenticated(secure3)


@pytest.mark.parametrize("client", test_transactions.CLIENTS)
def test_transactions_aborted_invisible_committed_seen_once(secure3: Cluster, client: str) -> None:
    """Each client's transactions (commit, abort, commit) read back by every client, read_committed
    and read_uncommitted, all over TLS + SCRAM."""
    test_transactions.test_aborted_is_invisible_to_read_committed_and_committed_is_seen_once(secure3, client)
    _inter_node_traffic_was_authenticated(secure3)
