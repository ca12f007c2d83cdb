"""Running out of descriptors or memory is not a disk fault.

EMFILE / ENFILE (no descriptor for this process / the system) and ENOMEM say nothing about the
disk: Kafka would take the log dir offline for any IOException, and so did we, which turned a
descriptor leak or a busy moment into a "failed disk". Here they fail the one operation with
ResourceExhaustedError (retriable), are counted, and logged loudly but at most once per
LOG_INTERVAL_S with the number suppressed meanwhile, so a storm of them cannot flood the log.
"""

from __future__ import annotations

import errno
import threading
import time
from typing import TypeGuard

import structlog

log = structlog.get_logger(__name__)

RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})
LOG_INTERVAL_S = 5.0

_lock = threading.Lock()
_count = 0
_suppressed = 0
_last_logged = float("-inf")


def is_resource_exhaustion(exc: BaseException) -> TypeGuard[OSError]:
    return isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS


def note_resource_exhaustion(where: str, operation: str, exc: OSError) -> None:
    """Count one exhaustion and log it unless one was logged within LOG_INTERVAL_S."""
    global _count, _suppressed, _last_logged
    with _lock:
        _count += 1
        now = time.monotonic()
        if now - _last_logged < LOG_INTERVAL_S:
            _suppressed += 1
            return
        suppressed, _suppressed, _last_logged = _suppressed, 0, now
        total = _count
    log.error(
        "storage_resources_exhausted",
        error=errno.errorcode.get(exc.errno or 0, str(exc.errno)),
        detail=str(exc),
        dir=where,
        operation=operation,
        total=total,
        suppressed_since_last=suppressed,
        action="request failed with a retriable error; log dir stays online",
    )


def resource_exhaustion_count() -> int:
    return _count


__all__ = ["is_resource_exhaustion", "note_resource_exhaustion", "resource_exhaustion_count"]
