"""Uuids as Kafka writes them in files: 22 characters of url-safe base64, no padding."""

from __future__ import annotations

import base64
import uuid


def format_uuid(value: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode("ascii")


def parse_uuid(text: str) -> uuid.UUID:
    """Kafka's base64 form, or the dashed hex form. ValueError if neither."""
    text = text.strip()
    if len(text) == 22:
        try:
            return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=="))
        except (ValueError, TypeError):
            pass
    return uuid.UUID(text)
