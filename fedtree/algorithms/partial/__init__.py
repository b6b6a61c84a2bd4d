"""Partial personalization: some parameters stay with each client (or each subtree), the rest are
shared: FedPer, FedRep, LG-FedAvg, FedBN, FedRoD, FedBABU, FedSA-LoRA (LoRA's ``B`` personal), local
training only, and X + FT (any algorithm fine-tuned per client). The split of a model into kept and
shared parts is one shared part (:mod:`~fedtree.algorithms.partial.split`)."""

from fedtree.algorithms.partial.fedbabu import fedbabu
from fedtree.algorithms.partial.fedbn import fedbn
from fedtree.algorithms.partial.fedper import fedper
from fedtree.algorithms.partial.fedrep import fedrep
from fedtree.algorithms.partial.fedrod import fedrod
from fedtree.algorithms.partial.fedsa_lora import fedsa_lora
from fedtree.algorithms.partial.finetuned import finetuned
from fedtree.algorithms.partial.lgfedavg import lgfedavg
from fedtree.algorithms.partial.local_only import local

__all__ = ["fedbabu", "fedbn", "fedper", "fedrep", "fedrod", "fedsa_lora", "finetuned", "lgfedavg", "local"]
