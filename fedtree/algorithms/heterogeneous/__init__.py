"""Clients with different model sizes in one vmapped tier: width sub-models as masks over the full
model's shapes (HeteroFL, FedRolex, FjORD)."""

from fedtree.algorithms.heterogeneous.fjord import fjord
from fedtree.algorithms.heterogeneous.heterofl import fedrolex, heterofl

__all__ = ["fedrolex", "fjord", "heterofl"]
