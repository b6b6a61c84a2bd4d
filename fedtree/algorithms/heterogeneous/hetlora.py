"""HetLoRA (Cho et al. 2024, "Heterogeneous LoRA for federated fine-tuning of on-device foundation
models") on any tree: every client its own rank.

The servers hold adapters of the largest rank ``r`` (the run's ``adapters.rank``). Client ``i`` has
rank ``r_i <= r`` (``ranks``): it receives the first ``r_i`` components of its parent's adapters
(``A[:, :r_i]``, ``B[:r_i, :]``: *truncation*), trains them (the zeroed components get zero gradients
and stay zero) and sends them; the parent pads every update with zeros to rank ``r`` and averages
(*zero-padding*): component ``j`` of the new model is the weighted mean over the cohort of the
clients' component ``j``, a client of rank ``<= j`` counting as zero. Weights are the host's
(``weighting``: examples, or uniform); the paper's sparsity weights (by ``‖B_i A_i‖``) and its local
rank self-pruning are not modelled. Each client is also scored with its parent's model truncated to
its rank (``truncated``).

Bytes are counted as sent: a client's message (each way) is its ``r_i`` components, the round's
``uplink_bytes``/``downlink_bytes`` the mean over the clients that trained. The update path is
refused: it would act on the zero-padded update (its norm and noise over components the client never
held).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.algorithms.host import Host, cannot, hierfavg, method_over
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup, NodeModels, ObjectiveFactory
from fedtree.core.local import ClientUpdate, counting, mean_over_trained, run_update, sgd_client_update
from fedtree.toolbox.lora import adapter_half, adapter_rank, check_adapters, truncate


def client_ranks(ranks: int | Sequence[int], num_clients: int, full: int, algorithm: str) -> np.ndarray:
  """``int32[C]``: ``ranks`` one per client, or a shorter list assigned in turn (client ``c`` gets
  ``ranks[c % len(ranks)]``).

  Raises:
    ValueError: a rank outside ``1 .. full``, an empty list, or more entries than clients.
  """
  r = np.atleast_1d(np.asarray(ranks, np.int64))
  if r.size == 0 or r.size > num_clients or r.ndim != 1:
    raise ValueError(f"{algorithm}: ranks={list(r.ravel())} needs 1 to {num_clients} (the clients) entries")
  if r.min() < 1 or r.max() > full:
    raise ValueError(f"{algorithm}: ranks={r.tolist()} must lie in 1..{full}, the adapters' rank (the "
                     f"largest client rank; set adapters.rank)")
  return r[np.arange(num_clients) % r.size].astype(np.int32)


def truncating(inner: ClientUpdate, ranks: np.ndarray, algorithm: str) -> ClientUpdate:
  """``inner`` run by a client of rank ``ranks[client]``: from its parent's adapters truncated to that
  rank, sending its trained adapters truncated (:func:`fedtree.toolbox.lora.truncate`). Its state is
  ``(rounds trained int32[C], inner's state)``: the count tells which clients sent (the bytes).

  Raises:
    ValueError: an ``inner`` that trains from the client's own model (it would never be truncated).
  """
  if inner.starts_from_own_model:
    raise ValueError(f"{algorithm}: the local objective trains from each client's own model, which HetLoRA "
                     f"cannot truncate to the client's rank; use one that starts from the parent's model")
  table = jnp.asarray(ranks)

  def step(anchor, own, data, num_steps, key, round):
    r = table[round.client]
    params, own, loss, message = run_update(inner, truncate(anchor, r), own, data, num_steps, key, round)
    return truncate(params, r), own, loss, message

  return counting(inner, step)


@method_over(hierfavg, cannot=(
  cannot("update_paths", "an update path would act on the zero-padded update (components the client never "
                         "held); run it without update_paths"),
  cannot("personal", "every adapter is truncated and zero-padded, a personal part would not be; run it "
                     "without personal"),
))
def hetlora(host: Host, *, ranks: tuple[int, ...] = (2, 4, 8),
            client_update: ClientUpdate | ObjectiveFactory | None = None,
            name: str = "hetlora") -> FederatedAlgorithm:
  """HetLoRA on ``topology`` (default flat): see the module docstring.

  Args:
    ranks: every client's rank, or a shorter list assigned in turn (``c % len``); each in ``1 .. r``,
      ``r`` the adapters' rank.
    client_update: the local objective (as :func:`~fedtree.algorithms.host.hierfavg.hierfavg`'s, e.g.
      FedProx's), run truncated.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`; ``model`` must be
      adapters on a frozen base (a run's ``adapters`` section).

  Raises:
    ValueError: a model whose parameters are not LoRA adapters, a rank outside ``1 .. r``, an update
      path or personal parameters.

  Example:
    >>> from fedtree.toolbox import lora
    >>> model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(16,))
    >>> alg = lora.frozen_base(lambda m: hetlora(model=m, data=data, ranks=(1, 2),
    ...                                          local_optimizer=optax.sgd(0.1),
    ...                                          schedule=LocalSchedule(batch_size=8, steps=2)),
    ...                        model=model, spec=lora.lora(rank=2), base=model.init(jax.random.key(0)))
    >>> state = loop.run(alg, data, num_rounds=1, key=jax.random.key(1))
    >>> sorted(alg.models(state))      # the global adapters and each client's, truncated to its rank
    ['global', 'truncated']
  """
  model, data = host["model"], host["data"]
  template = host.get("init_params")
  if template is None:
    template = jax.eval_shape(model.init, jax.random.key(0))
  check_adapters(template, name)
  full = adapter_rank(template)
  table = client_ranks(ranks, int(data.num_clients), full, name)
  given = client_update

  def objective(s: LocalSetup) -> ClientUpdate:
    if given is None:
      inner = sgd_client_update(s.model, s.optimizer, batch_size=s.batch_size, max_steps=s.max_steps,
                                compute_dtype=s.compute_dtype)
    else:
      inner = given if isinstance(given, ClientUpdate) else given(s)
    return truncating(inner, table, name)

  alg = host.build(client_update=objective, name=name)
  per_component = _component_bytes(template)

  def round_fn(state, data, key):
    new, metrics = alg.round(state, data, key)
    size = mean_over_trained(state.client_state, new.client_state, table, data.window) * per_component
    return new, {**metrics, "uplink_bytes": size, "downlink_bytes": size}

  def models(state):
    out = dict(alg.models(state))
    top = out[[k for k in out if k == "global" or k.startswith("level")][-1]]   # the clients' parents
    rows = jax.tree.map(lambda a: jnp.take(a, jnp.asarray(top.model_of_client), axis=0), top.params)
    out["truncated"] = NodeModels(jax.vmap(truncate)(rows, jnp.asarray(table)),
                                  np.arange(table.size, dtype=np.int32))
    return out

  return alg._replace(round=round_fn, models=models)


def _component_bytes(template) -> float:
  """Bytes of one rank component of every adapted kernel (a column of ``A`` and a row of ``B``)."""
  total = 0.0
  for half in ("a", "b"):
    for leaf in jax.tree.leaves(adapter_half(template, half)):
      shape = np.shape(leaf)
      other = shape[0] if half == "a" else shape[-1]
      total += other * jnp.dtype(leaf.dtype).itemsize
  return total
