"""Populations that do not fit on the device (issue 49): client data in a store on disk read by client
id (:mod:`~fedtree.population.store`), the next cohorts read while this one trains
(:mod:`~fedtree.population.reader`), per-client state paged by client id
(:mod:`~fedtree.population.paged`), evaluation on a sample of the clients
(:mod:`~fedtree.population.evaluation`), and the sources converted client by client
(:mod:`~fedtree.population.convert`; the command is ``python -m fedtree.convert``).
"""

from fedtree.population.evaluation import EvalClients, every_client, sample_clients
from fedtree.population.paged import PagedSnapshot, PagedState
from fedtree.population.reader import CohortReader, ReaderStats
from fedtree.population.store import (
  ClientBlock,
  ClientStore,
  Feature,
  StoreWriter,
  open_store,
  write_federated_data,
)

__all__ = [
  "ClientBlock", "ClientStore", "CohortReader", "EvalClients", "Feature", "PagedSnapshot", "PagedState",
  "ReaderStats", "StoreWriter", "every_client", "open_store", "sample_clients", "write_federated_data",
]
