"""Client quotas without a cluster: Kafka's resolution order, the sampled rate's throttle, and
ClientQuotaRecords surviving a metadata snapshot (tests/test_admin_apis.py drives real clients)."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from broker.quotas.manager import ClientQuotas, QuotaWindows
from broker.quotas.resolve import resolve
from controller.snapshots import image_records
from metadata.image import MetadataDelta, MetadataImage
from protocol.generated.metadata_records.client_quota_record import ClientQuotaRecord

# timing- or CPU-sensitive: runs after the parallel part of `make test`, alone
pytestmark = pytest.mark.serial

KEY = "producer_byte_rate"


def image_with(*entries: tuple[list[tuple[str, str | None]], str, float]) -> MetadataImage:
    d = MetadataDelta(MetadataImage.EMPTY)
    for i, (pairs, key, value) in enumerate(entries):
        d.replay(ClientQuotaRecord(entity=[ClientQuotaRecord.EntityData(t, n) for t, n in pairs], key=key,
                                   value=value, remove=False), i)
    return d.apply()


def test_resolution_follows_kafkas_order() -> None:
    levels = [
        ([("user", "ANONYMOUS"), ("client-id", "app")], 1),
        ([("user", "ANONYMOUS"), ("client-id", None)], 2),
        ([("user", "ANONYMOUS")], 3),
        ([("user", None), ("client-id", "app")], 4),
        ([("user", None), ("client-id", None)], 5),
        ([("user", None)], 6),
        ([("client-id", "app")], 7),
        ([("client-id", None)], 8),
    ]
    # take the most specific away one at a time: the next one in Kafka's order applies
    for i in range(len(levels)):
        img = image_with(*[(pairs, KEY, float(v)) for pairs, v in levels[i:]])
        bucket, bound = resolve(img.client_quotas, KEY, "ANONYMOUS", "app")
        assert bound == levels[i][1]
        # defaults share nothing: the bucket names this client's own user and client id
        assert all(n is not None for _, n in bucket)
    assert resolve(image_with(([("client-id", "other")], KEY, 1.0)).client_quotas, KEY, "ANONYMOUS", "app") is None
    assert resolve(image_with(([("client-id", "app")], "consumer_byte_rate", 1.0)).client_quotas, KEY,
                   "ANONYMOUS", "app") is None


@pytest.mark.parametrize(("samples", "tolerance"), [(2, 0.05), (11, 0.15)])
def test_a_client_that_waits_its_throttle_goes_at_its_bound(samples: int, tolerance: float) -> None:
    """Kafka's sampled rate lets a client that waits each throttle out run a little over its bound
    with many samples (history is lost a window at a time); tests/test_admin_apis.py runs brokers with 2."""
    bound = 100_000.0
    quotas = {(("client-id", "c"),): MappingProxyType({KEY: bound})}
    now = [0.0]
    q = ClientQuotas(lambda: quotas, QuotaWindows(samples, 1.0), clock=lambda: now[0])
    sent = []
    while now[0] < 60:
        wait = q.record_produce("c", 20_000)
        sent.append((now[0], 20_000))
        now[0] += max(wait, 0.001)
    steady = sum(n for t, n in sent if 20 <= t < 60) / 40
    assert abs(steady - bound) / bound < tolerance, steady
    assert q.record_produce("someone-else", 10**9) == 0  # no quota applies to it


def test_client_quotas_survive_a_snapshot() -> None:
    img = image_with(([("client-id", "app")], KEY, 1024.0), ([("user", None)], "request_percentage", 50.0),
                     ([("ip", "10.0.0.1")], "connection_creation_rate", 5.0))
    d = MetadataDelta(MetadataImage.EMPTY)
    for r in image_records(img):
        d.replay(r)
    assert d.apply().client_quotas == img.client_quotas
    gone = MetadataDelta(img)
    gone.replay(ClientQuotaRecord(entity=[ClientQuotaRecord.EntityData("client-id", "app")], key=KEY, value=0.0,
                                  remove=True))
    assert (("client-id", "app"),) not in gone.apply().client_quotas
