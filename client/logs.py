"""The client library's loggers: the standard `logging` module under the library's own names
(`client.consumer`, `client.producer`), through structlog's stdlib integration so call sites keep
their key=value events. Nothing global is configured and no handler is added: the application
decides where records go. Every event here is INFO or DEBUG, below the WARNING that Python's
last-resort handler prints, so an application that configures nothing sees nothing."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

import structlog


def _render(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> str:
    name = event.pop("event", "")
    return " ".join([str(name), *(f"{k}={v}" for k, v in event.items())])


def get_logger(name: str) -> Any:
    """A logger bound to stdlib `logging.getLogger(name)`, with its own processors (so structlog's
    global configuration, which a host process may set, is neither used nor changed)."""
    return structlog.wrap_logger(
        logging.getLogger(name),
        processors=[structlog.stdlib.filter_by_level, _render],
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
