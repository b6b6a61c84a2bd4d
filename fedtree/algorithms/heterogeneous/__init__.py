"""Clients with different model sizes in one vmapped tier: width sub-models as masks over the full
model's shapes (HeteroFL, FedRolex, FjORD), LoRA adapters of a rank per client (HetLoRA) or depths with
exits (DepthFL), and distillation of the
clients' ensemble (FedDF) or consensus on public inputs (FedMD)."""

from fedtree.algorithms.heterogeneous.depthfl import depthfl
from fedtree.algorithms.heterogeneous.feddf import feddf
from fedtree.algorithms.heterogeneous.fedmd import fedmd
from fedtree.algorithms.heterogeneous.fjord import fjord
from fedtree.algorithms.heterogeneous.heterofl import fedrolex, heterofl
from fedtree.algorithms.heterogeneous.hetlora import hetlora

__all__ = ["depthfl", "feddf", "fedmd", "fedrolex", "fjord", "heterofl", "hetlora"]
