"""FedKWS-UI (paper 002: Li et al. 2022): ALO and ALT as two switches on HierFAVG, on any tree.

The method's equations and the authors' code's differences: :doc:`FedKWS-UI <algorithms/fedkws.md>`
and :doc:`the optimization page <algorithms/optimization.md#fedkws-ui>`.

References:
  Li et al., Avoid overfitting user specific information in federated keyword spotting, 2022.
"""

from __future__ import annotations

import numpy as np
import optax

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.algorithms.optimization.fedkws.alt import alt_schedule, client_utility
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.objectives.alo import alo_update, check_alo, check_private, main_params, with_private_head


@method_over(hierfavg)
def fedkws(
  host: Host,
  *,
  mu: float = 0.2,
  lam: float = 0.001,
  alo: bool = True,
  alt: bool = True,
  r0: float | None = None,
  min_steps: int = 1,
  private: str = "persistent",
  private_optimizer: optax.GradientTransformation | None = None,
  private_steps: int | None = None,
  private_steps_ratio: float | None = None,
  mu_weighting: bool = False,
  utility_n_max: float | None = None,
  max_grad_norm: float | None = None,
  name: str = "fedkws",
) -> FederatedAlgorithm:
  """FedKWS-UI (or one of its ablations) on ``topology`` (default flat).

  Args:
    mu: ALO label smoothing μ in ``[0, 1)`` (paper 0.2).
    lam: ALO adversarial weight λ >= 0 (paper 0.001).
    alo: use ALO as the local objective.
    alt: use ALT step counts; the schedule must then be a fixed step count E.
    r0: ALT's ``r_0`` (``None``: ``K / Σ r̄_k``, the work conserved).
    min_steps: ALT's floor on every client's step count.
    private: ``"persistent"`` (the paper's form: a private model per client, kept across
      rounds) or ``"head"`` (the authors' code, difference (a) in :mod:`fedtree.objectives.alo`:
      a second copy of the model's classifier layer on the shared encoder, part of the
      global model, re-started from it every round and trained with the encoder frozen;
      refused with a ``ValueError`` for a model whose logits are not an ``nn.Dense``'s or
      whose labels are sequences).
    private_optimizer: optimizer of the private models or head (default the local optimizer).
    private_steps: steps of a private model per round (default: the client's own count).
    private_steps_ratio: ``None`` (paper form), or the private model or head trains
      ``int(ratio · E) + 1`` steps per round (the authors' code: 0.2, difference (b)), ``E`` the
      schedule's step count before ALT's scaling (with ``alt``: the base ``E`` of every client;
      without: the client's own count; a client with none takes none). At most one of
      ``private_steps`` and ``private_steps_ratio``.
    mu_weighting: the authors' code (difference (c) in :mod:`fedtree.objectives.alo`): client
      ``k`` smooths with ``μ (1 - r̄_k)``, ``r̄_k`` its ALT utility; ``False`` (paper): one μ.
    utility_n_max: the client size that counts as full in the utility ``r̄_k`` of ALT and of
      ``mu_weighting`` (``None``: the largest client's, the paper's; the authors' code: 100
      for 12 classes, 300 for 35).
    max_grad_norm: clip every local gradient to this global norm (the authors' code,
      difference (d)); ``None`` (paper): no clipping.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg` (``model``,
      ``data``, ``local_optimizer``, ``schedule``, ``topology``, ...); ``compute_dtype`` gives
      mixed-precision local steps, ALO's or plain ones.

  Example:
    One round of FedKWS-UI (ALO local objective, ALT step counts) over 5 clients:

    >>> common = dict(model=model, data=data, schedule=LocalSchedule(batch_size=8, steps=1))
    >>> alg = fedkws(local_optimizer=optax.sgd(0.1), **common)
    >>> state = loop.run(alg, data, num_rounds=1, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    [...]
  """
  check_alo(mu, lam)
  check_private(private, private_steps, private_steps_ratio)
  model, data, schedule = host["model"], host["data"], host["schedule"]
  if alt:
    base_steps = schedule.steps
    schedule = alt_schedule(schedule, data, r0=r0, min_steps=min_steps, n_max=utility_n_max)
    if alo and private_steps_ratio is not None:     # of the base count E, as the authors' code
      private_steps, private_steps_ratio = int(private_steps_ratio * int(base_steps)) + 1, None
  objective = None
  head = private == "head"
  if alo:
    utility = None
    if mu_weighting:
      utility = client_utility(np.asarray(data.n_train), np.asarray(data.y_train), data.num_classes,
                               utility_n_max)

    def objective(s: LocalSetup):
      # (under private="head" the host trains with_private_head's model; ALO's steps take the model it wraps)
      return alo_update(model if head else s.model, s.optimizer, mu=mu, lam=lam, private=private,
                        private_optimizer=private_optimizer, private_steps=private_steps,
                        private_steps_ratio=private_steps_ratio, client_utility=utility,
                        max_grad_norm=max_grad_norm, batch_size=s.batch_size, max_steps=s.max_steps,
                        compute_dtype=s.compute_dtype)
  elif mu_weighting or max_grad_norm is not None or head or private_steps_ratio is not None:
    raise ValueError(f"fedkws: mu_weighting={mu_weighting}, max_grad_norm={max_grad_norm}, "
                     f"private={private!r} and private_steps_ratio={private_steps_ratio} are ALO options; "
                     f"set alo=True or leave them off")
  init_params = host.get("init_params")
  derived = {"schedule": schedule, "init_params": None if head else init_params,   # (from the host's)
             "model": with_private_head(model, data.example_shape, init_params) if head else model}
  alg = host.replace(**derived).build(client_update=objective, name=name)
  if not head:
    return alg

  def models(state):   # the main head: what the plain model evaluates
    return {k: nm._replace(params=main_params(nm.params)) for k, nm in alg.models(state).items()}

  return alg._replace(models=models)
