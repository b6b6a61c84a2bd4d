"""Pluggable local objectives: what a client does with the model it downloads.

Every local objective lives here. Each factory returns a
:class:`~fedtree.core.local.ClientUpdate` (vmapped over a cohort by
:func:`fedtree.core.tier.train_cohort`), built on the one masked scan
:func:`fedtree.core.local.run_local_steps`, so every objective composes with any tree and any
server optimizer (e.g. ``hierfavg(..., client_update=ditto_update(...))``).

* FedProx (Li et al. 2020): ``f_i(θ) + (μ/2)‖θ - Θ‖²`` (:func:`fedprox_update`).
* FedMMD (Yao et al. 2018): ``f_i(θ) + λ MMD²(φ_θ, φ_Θ)`` between the penultimate features of
  the trained and the downloaded model (:func:`fedmmd_update`).
* ALO (FedKWS-UI, Li et al. 2022): label smoothing plus negative distillation from a private
  model, persistent per client or (the authors' code) a second head of the global model
  (:func:`alo_update`, :func:`with_private_head`).
* Ditto (Li et al. 2021): a persistent personal model ``v_i`` trained on
  ``f_i(v) + (λ/2)‖v - Θ‖²`` whenever the client is sampled, next to plain local training of
  the model sent up (:func:`ditto_update`). ``v_i`` is the client state, stacked ``[C, ...]``.
* pFedMe (Dinh et al. 2020): per local round, ``K`` inner steps approximately solve the
  Moreau-envelope problem ``θ̂ = argmin_θ f_i(θ; batch) + (λ/2)‖θ - w‖²``
  (:func:`moreau_solver`, reusable by pFedMT), then ``w ← w - η λ (w - θ̂)``
  (:func:`pfedme_update`). The personal model ``θ̂_i`` is the client state.
* Per-FedAvg (Fallah et al. 2020): a MAML step ``w ← w - β ∇f(w - α∇f(w; D); D')``,
  first-order (``"fo"``) or Hessian-free (``"hf"``: ``- β (I - α∇²f(w; D''))∇f(w̃; D')``
  with an exact Hessian-vector product) (:func:`perfedavg_update`). The extra batches
  ``D', D''`` are drawn with :func:`~fedtree.core.local.batch_at` under their own keys.

Choices (documented here since the papers leave them open): the pFedMe personal model starts
every round from the downloaded model and is warm-started across the ``R`` local rounds, with
the ``K`` inner steps on the same minibatch (as the authors' code); the Ditto personal model
takes as many steps as the local schedule gives the global model.
"""

from fedtree.core.checks import check_nonnegative, check_positive
from fedtree.objectives.alo import (
  ALOCarry,
  ALOState,
  alo_loss,
  alo_update,
  check_alo,
  make_alo_step,
  with_private_head,
)
from fedtree.objectives.ditto import DittoState, ditto_update
from fedtree.objectives.fedmmd import KERNELS, check_features, fedmmd_update, last_dense, mmd2, penultimate
from fedtree.objectives.fedprox import fedprox_update
from fedtree.objectives.moreau import (
  MoreauCarry,
  MoreauSolver,
  PFedMeCarry,
  PFedMeState,
  moreau_client_update,
  moreau_objective,
  moreau_solver,
  moreau_step,
  pfedme_update,
)
from fedtree.objectives.perfedavg import PERFEDAVG_VARIANTS, perfedavg_step, perfedavg_update, tree_sub_scaled

__all__ = [
  "KERNELS", "PERFEDAVG_VARIANTS", "ALOCarry", "ALOState", "DittoState", "MoreauCarry", "MoreauSolver",
  "PFedMeCarry", "PFedMeState", "alo_loss", "alo_update", "check_alo", "check_features",
  "check_nonnegative", "check_positive", "ditto_update", "fedmmd_update", "fedprox_update",
  "last_dense", "make_alo_step", "mmd2", "moreau_client_update", "moreau_objective", "moreau_solver",
  "moreau_step", "penultimate", "perfedavg_step", "perfedavg_update", "pfedme_update", "tree_sub_scaled",
  "with_private_head",
]
