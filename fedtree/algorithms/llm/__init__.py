"""Federated fine-tuning methods defined on LoRA adapters (issue 50), a family of the algorithms wing:
each a thin spec over the HierFAVG host, so every option of the host (trees, server optimizers,
sampling, objectives, the update path where the method allows it) works with it.

* :func:`ffa_lora`: FFA-LoRA (Sun et al. 2024), ``A`` frozen at a seed's draw, ``B`` trained and sent;
* :func:`hetlora`: HetLoRA (Cho et al. 2024), a rank per client, truncation down and zero-padding up.

FedSA-LoRA (Guo et al. 2025: ``A`` shared, ``B`` personal) is partial personalization and lives in its
family: :func:`fedtree.algorithms.partial.fedsa_lora.fedsa_lora`. Every other method of
:data:`fedtree.experiment.registry.SPECS` whose spec takes ``adapters`` runs on adapters unchanged
(FedAvg, FedProx, SCAFFOLD, FedOpt's FedAvgM/FedAdam/FedYogi, HierFAVG, Ditto, GroupPerFL).
"""

from fedtree.algorithms.llm.ffa_lora import ffa_lora
from fedtree.algorithms.llm.hetlora import hetlora

__all__ = ["ffa_lora", "hetlora"]
