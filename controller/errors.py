"""ApiError: a Kafka error code with a message a human understands."""

from __future__ import annotations

from protocol.errors import Errors, error_message, error_name


class ApiError(Exception):
    def __init__(self, code: int, message: str | None = None) -> None:
        self.code = code
        self.message = message if message is not None else error_message(code)
        super().__init__(f"{error_name(code)}: {self.message}")


__all__ = ["ApiError", "Errors"]
