"""What a request handler is: a coroutine given the controller's managers (`Apis`) and the
decoded request, returning the response body. Each handler module lists its own handlers in a
`HANDLERS` table of this shape; `catalog` gathers them.

Handler modules import this module and nothing imports them but `catalog`, so registering a
handler never makes an import circle.
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
    """The controller and its managers, as every handler receives them."""

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
# API key -> (lowest served version, highest served version, handler)
HandlerTable = dict[int, tuple[int, int, Handler]]
