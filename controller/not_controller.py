"""NOT_CONTROLLER answers: a standby, or a leader that lost its epoch mid-request, answers every
item of a request with NOT_CONTROLLER (retriable: the sender finds the active controller and
sends again; nothing was applied). The shapes are node/authz's, with the admin requests an
authorizer checks per resource."""

from __future__ import annotations

from typing import Any

from node.authz import ADMIN_ITEM_ERRORS, DENIALS, error_items
from protocol.errors import Errors

CODE = Errors.NOT_CONTROLLER
MESSAGE = "This is not the active controller."
SHAPES = {**DENIALS, **ADMIN_ITEM_ERRORS}


def not_controller_body(api_key: int, version: int, body: Any) -> Any:
    """The response body answering `body` with NOT_CONTROLLER, or None if it has no error field."""
    return error_items(api_key, version, body, CODE, MESSAGE, SHAPES)
