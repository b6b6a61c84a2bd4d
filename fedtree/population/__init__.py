"""Populations that do not fit on the device: client data read from a store on disk by client id,
the next cohorts read while this one trains, per-client state paged by client id, evaluation on a
sample of the clients (issue 49).
"""

from fedtree.population.store import (
    ClientBlock,
    ClientStore,
    Feature,
    StoreWriter,
    open_store,
    write_federated_data,
)

__all__ = ["ClientBlock", "ClientStore", "Feature", "StoreWriter", "open_store", "write_federated_data"]
