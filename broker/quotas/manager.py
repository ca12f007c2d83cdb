"""Client quota enforcement, as Kafka's ClientQuotaManager: record what a request used against
the quota that applies to its client, and when the client is over, how long it must wait.

The wait is Kafka's: (rate - bound) / bound * the span the rate is measured over, at most that
span, so a client that waits it out comes back exactly at its bound. The request is answered at
once with throttle_time_ms and its connection is muted for as long (KIP-219).

Quotas come from the broker's metadata image (ClientQuotaRecords), so a change applies to the
next request. Rates of clients idle for a full measuring span are dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog

from broker.quotas.rate import SampledRate
from broker.quotas.resolve import ANONYMOUS, resolve
from metadata.client_quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE, Entity
from node.config import ConfigError, NodeConfig

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class QuotaWindows:
    samples: int = 11  # quota.window.num
    window: float = 1.0  # quota.window.size.seconds

    @classmethod
    def from_config(cls, cfg: NodeConfig) -> QuotaWindows:
        samples = cfg.int("quota.window.num", 11)
        window = cfg.int("quota.window.size.seconds", 1)
        if samples < 2 or window < 1:
            raise ConfigError("quota.window.num must be at least 2 and quota.window.size.seconds at least 1")
        return cls(samples, float(window))


class QuotaKind:
    """The rates of one quota key, one per bucket (metadata.client_quotas entity)."""

    def __init__(self, key: str, windows: QuotaWindows, clock: Callable[[], float]) -> None:
        self.key = key
        self.windows = windows
        self.clock = clock
        self.rates: dict[Entity, SampledRate] = {}
        self._last_sweep = clock()

    def record(self, quotas: Mapping[Entity, Mapping[str, float]], client_id: str, amount: float,
               user: str = ANONYMOUS) -> float:
        """Record `amount`; the seconds the client must now wait (0 when within its quota)."""
        found = resolve(quotas, self.key, user, client_id)
        if found is None:
            return 0.0
        bucket, bound = found
        now = self.clock()
        rate = self.rates.get(bucket)
        if rate is None:
            rate = self.rates[bucket] = SampledRate(self.windows.samples, self.windows.window)
        rate.record(amount, now)
        self._sweep(now)
        span = rate.span(now)
        observed = rate.rate(now)
        if observed <= bound:
            return 0.0
        return min((observed - bound) / bound * span, span)

    def _sweep(self, now: float) -> None:
        horizon = self.windows.samples * self.windows.window
        if now - self._last_sweep < horizon:
            return
        self._last_sweep = now
        for bucket in [b for b, r in self.rates.items() if r.idle_since(now) > horizon]:
            del self.rates[bucket]


class ClientQuotas:
    """The three enforced quota kinds of one broker."""

    def __init__(self, quotas: Callable[[], Mapping[Entity, Mapping[str, float]]], windows: QuotaWindows,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.quotas = quotas  # the current image's client quotas
        self.produce = QuotaKind(PRODUCER_BYTE_RATE, windows, clock)
        self.fetch = QuotaKind(CONSUMER_BYTE_RATE, windows, clock)
        self.request = QuotaKind(REQUEST_PERCENTAGE, windows, clock)
        self._seen: object = None
        self._any_request = False

    def any_request_quota(self) -> bool:
        """Whether request time must be measured at all (asked on every request: cached per image)."""
        quotas = self.quotas()
        if quotas is not self._seen:
            self._seen = quotas
            self._any_request = any(REQUEST_PERCENTAGE in v for v in quotas.values())
        return self._any_request

    # `user`: the connection's principal name (a SASL user, a certificate's subject), else ANONYMOUS
    def record_produce(self, client_id: str, nbytes: int, user: str = ANONYMOUS) -> float:
        return self.produce.record(self.quotas(), client_id, nbytes, user)

    def record_fetch(self, client_id: str, nbytes: int, user: str = ANONYMOUS) -> float:
        return self.fetch.record(self.quotas(), client_id, nbytes, user)

    def record_request_time(self, client_id: str, seconds: float, user: str = ANONYMOUS) -> float:
        # request_percentage is a share of one thread: 100 = one full second of work per second
        return self.request.record(self.quotas(), client_id, seconds * 100, user)
