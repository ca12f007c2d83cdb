"""Request handlers: thin translations between Kafka requests and the controller's managers.

One module per API family. Each handler takes (Apis, Request) and returns the response body;
`HANDLERS` maps API key -> (min version, max version, handler) and is also what ApiVersions
advertises, so nothing unimplemented is ever advertised.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from controller.acls import AclControl
from controller.chunks import ChunkControl
from controller.client_quotas import ClientQuotaControl
from controller.cluster import ClusterControl
from controller.configs import ConfigControl
from controller.controller import Controller
from controller.dir_assignment import DirAssignmentControl
from controller.partitions import PartitionControl
from controller.producer_ids import ProducerIdControl
from controller.scram import ScramControl
from controller.topics import TopicControl
from protocol.headers import Request


@dataclass
class Apis:
    controller: Controller
    cluster: ClusterControl
    topics: TopicControl
    configs: ConfigControl
    partitions: PartitionControl
    producer_ids: ProducerIdControl
    chunks: ChunkControl
    client_quotas: ClientQuotaControl
    dir_assignment: DirAssignmentControl
    scram: ScramControl
    acls: AclControl
    served: dict[int, tuple[int, int]] = field(default_factory=dict)  # what ApiVersions lists

    @classmethod
    def create(cls, controller: Controller) -> Apis:
        return cls(
            controller,
            ClusterControl(controller),
            TopicControl(controller),
            ConfigControl(controller),
            PartitionControl(controller),
            ProducerIdControl(controller),
            ChunkControl(controller),
            ClientQuotaControl(controller),
            DirAssignmentControl(controller),
            ScramControl(controller),
            AclControl(controller),
        )


Handler = Callable[[Apis, Request], Awaitable[Any]]


def handlers() -> dict[int, tuple[int, int, Handler]]:
    from controller.apis import (
        acls,
        api_versions,
        chunks,
        client_quotas,
        cluster,
        configs,
        dir_assignment,
        fetch,
        partitions,
        producer_ids,
        quorum,
        scram,
        topics,
    )

    table: dict[int, tuple[int, int, Handler]] = {}
    for module in (
        acls, api_versions, chunks, client_quotas, cluster, configs, dir_assignment, fetch, partitions, producer_ids,
        quorum, scram, topics,
    ):
        table.update(module.HANDLERS)
    return table
