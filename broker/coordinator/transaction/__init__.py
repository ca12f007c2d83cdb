"""The transaction coordinator: transactional ids, their producer ids and epochs, and their
transactions' state in __transaction_state; markers to the partitions when a transaction ends."""

from broker.coordinator.transaction.config import TransactionCoordinatorConfig
from broker.coordinator.transaction.coordinator import TransactionCoordinator
from broker.coordinator.transaction.metadata import TransactionMetadata
from broker.coordinator.transaction.records import TRANSACTION_STATE_TOPIC, TransactionState

__all__ = [
    "TRANSACTION_STATE_TOPIC",
    "TransactionCoordinator",
    "TransactionCoordinatorConfig",
    "TransactionMetadata",
    "TransactionState",
]
