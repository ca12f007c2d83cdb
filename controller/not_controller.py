"""NOT_CONTROLLER answers: a standby, or a leader that lost its epoch mid-request, answers every
item of a request with NOT_CONTROLLER (retriable: the sender finds the active controller and
sends again; nothing was applied). Shapes the authorization denials do not cover are here."""

from __future__ import annotations

from typing import Any

from node.authz import deny_items
from protocol.errors import Errors
from protocol.generated import RESPONSES

CODE = Errors.NOT_CONTROLLER
MESSAGE = "This is not the active controller."


def not_controller_body(api_key: int, version: int, body: Any) -> Any:
    """The response body answering `body` with NOT_CONTROLLER, or None if it has no error field."""
    R = RESPONSES[api_key]
    if api_key == 19:
        return R(topics=[R.CreatableTopicResult(name=t.name, error_code=CODE, error_message=MESSAGE)
                         for t in body.topics])
    if api_key in (33, 44):
        return R(responses=[R.AlterConfigsResourceResponse(error_code=CODE, error_message=MESSAGE,
                                                           resource_type=r.resource_type,
                                                           resource_name=r.resource_name) for r in body.resources])
    if api_key == 37:
        return R(results=[R.CreatePartitionsTopicResult(name=t.name, error_code=CODE, error_message=MESSAGE)
                          for t in body.topics])
    if api_key == 43:
        return R(error_code=CODE, replica_election_results=[R.ReplicaElectionResult(
            topic=t.topic, partition_result=[R.PartitionResult(partition_id=p, error_code=CODE, error_message=MESSAGE)
                                             for p in t.partitions]) for t in (body.topic_partitions or [])])
    if api_key == 49:
        return R(entries=[R.EntryData(error_code=CODE, error_message=MESSAGE, entity=[
            R.EntityData(entity_type=e.entity_type, entity_name=e.entity_name) for e in x.entity])
            for x in body.entries])
    return deny_items(api_key, version, body, CODE)
