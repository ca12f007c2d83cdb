"""Request handlers: thin translations between Kafka requests and the controller's managers.

One module per API family. Each handler takes (Apis, Request) and returns the response body;
`HANDLERS` maps API key -> (min version, max version, handler) and is also what ApiVersions
advertises, so nothing unimplemented is ever advertised. AlterPartition, elections and
reassignments (next issue) go in a new `apis/partitions.py` registered here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from controller.cluster import ClusterControl
from controller.configs import ConfigControl
from controller.controller import Controller
from controller.topics import TopicControl
from protocol.headers import Request


@dataclass
class Apis:
    controller: Controller
    cluster: ClusterControl
    topics: TopicControl
    configs: ConfigControl
    served: dict[int, tuple[int, int]] = field(default_factory=dict)  # what ApiVersions lists

    @classmethod
    def create(cls, controller: Controller) -> Apis:
        return cls(controller, ClusterControl(controller), TopicControl(controller), ConfigControl(controller))


Handler = Callable[[Apis, Request], Awaitable[Any]]


def handlers() -> dict[int, tuple[int, int, Handler]]:
    from controller.apis import api_versions, cluster, configs, fetch, topics

    table: dict[int, tuple[int, int, Handler]] = {}
    for module in (api_versions, cluster, configs, fetch, topics):
        table.update(module.HANDLERS)
    return table
