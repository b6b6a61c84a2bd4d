"""FedBABU (Oh et al. 2022): FedAvg of the body with the head frozen at its initialization, fine-tuned
per client at evaluation, on any tree.

The re-drawn head (``redrawn_head``) and the method (``fedbabu``). How it runs and how PFLlib,
FL-bench and FLGo differ: :doc:`FedBABU on the partial-personalization page
<algorithms/partial.md#fedbabu>`.

References:
  Oh, Kim and Yun, FedBABU: toward enhanced representation for federated image classification,
  ICLR 2022.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.algorithms.partial.finetuned import finetune_schedule, finetuned
from fedtree.algorithms.partial.split import Head, head_patterns, split_model, with_parameter_counts
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup, NodeModels, TreeState
from fedtree.core.local import sgd_client_update, train_only
from fedtree.core.membership import clients_node
from fedtree.core.model import Model, param_paths
from fedtree.core.personal import parameter_counts, personal
from fedtree.core.rng import stream
from fedtree.core.topology import Topology

PyTree = Any
HEAD_INITS = {"model": None, "he_uniform": jax.nn.initializers.he_uniform(),
              "xavier_uniform": jax.nn.initializers.xavier_uniform(),
              "orthogonal": jax.nn.initializers.orthogonal()}
"""How the frozen head is drawn: the model's own initializer, or a re-draw of its kernels."""
FINETUNE_PARTS = ("all", "head", "body")


def redrawn_head(model: Model, mask: PyTree, head_init: str) -> Model:
  """``model`` whose ``init`` re-draws the head's kernels (the leaves of ``mask`` named ``kernel``)
  with ``HEAD_INITS[head_init]`` from a stream of the init key; ``"model"``: ``model`` unchanged."""
  initializer = HEAD_INITS[head_init]
  if initializer is None:
    return model
  init = model.init

  def redraw(key):
    params = init(key)
    flat, treedef = jax.tree.flatten(params)
    paths = param_paths(params)
    heads = jax.tree.leaves(mask)
    keys = jax.random.split(stream(key, "head_init"), len(flat))
    out = [initializer(k, x.shape, x.dtype) if m and p.endswith("kernel") else x
           for k, x, p, m in zip(keys, flat, paths, heads, strict=True)]
    return jax.tree.unflatten(treedef, out)

  return model._replace(init=redraw)


@method_over(hierfavg, sets={"personal": "the frozen head is chosen with head="})
def fedbabu(
  host: Host,
  *,
  head: Head = 1,
  head_init: str = "model",
  finetune_epochs: float = 5.0,
  finetune_steps: int = 0,
  finetune_learning_rate: float | None = None,
  finetune_part: str = "all",
  finetune_optimizer: str = "sgd",
  name: str = "fedbabu",
) -> FederatedAlgorithm:
  """FedBABU on ``topology`` (default flat): FedAvg of the body, the head frozen at its initialization,
  every client fine-tuning the global model at evaluation (:doc:`the method's page
  <algorithms/partial.md#fedbabu>`).

  Args:
    head: the frozen head: the model's last ``head`` layers (an int) or path patterns.
    head_init: ``"model"`` (the model's random initialization, the paper) or a re-draw of the
      head's kernels: ``"he_uniform"``, ``"xavier_uniform"``, ``"orthogonal"`` (FLGo's
      ``head_init``).
    finetune_epochs: fine-tuning epochs over each client's data at evaluation (>= 0).
    finetune_steps: fine-tuning steps instead (>= 0; give one of the two; both 0: no fine-tuning,
      FedAvg with a frozen head).
    finetune_learning_rate: the fine-tune's rate (default ``local_learning_rate``, the local rate).
    finetune_part: ``"all"`` (the paper), ``"head"`` or ``"body"``: what the fine-tune trains.
    finetune_optimizer: the fine-tune's optax optimizer by name.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`.

  Raises:
    ValueError: a head covering every parameter, an unknown ``head_init`` or ``finetune_part``,
      negative fine-tuning counts or both, no fine-tuning rate, ``head_init`` with
      ``init_params``, ``personal=``.

  Example:
    Two rounds over 5 clients; each client then fine-tunes 3 steps:

    >>> model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(8,))
    >>> alg = fedbabu(model=model, data=data, local_optimizer=optax.sgd(0.1), local_learning_rate=0.1,
    ...               schedule=LocalSchedule(batch_size=8, steps=2), finetune_epochs=0, finetune_steps=3)
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['global', 'global_ft']
  """
  if head_init not in HEAD_INITS:
    raise ValueError(f"{name}: head_init={head_init!r}; choose one of {tuple(HEAD_INITS)}")
  if finetune_part not in FINETUNE_PARTS:
    raise ValueError(f"{name}: finetune_part={finetune_part!r}; choose one of {FINETUNE_PARTS}")
  if head_init != "model" and host.get("init_params") is not None:
    raise ValueError(f"{name}: head_init={head_init!r} re-draws the head of model.init, but init_params is "
                     f"given (the run starts from it); use head_init='model'")
  schedule = host["schedule"]
  tune = finetune_schedule(finetune_steps, finetune_epochs, schedule.batch_size, algorithm=name)
  rate = host.get("local_learning_rate") if finetune_learning_rate is None else finetune_learning_rate
  if tune is not None and rate is None:
    raise ValueError(f"{name}: the fine-tune needs a learning rate: finetune_learning_rate= or "
                     f"local_learning_rate= (from a config: local.learning_rate)")
  model: Model = host["model"]
  patterns = head_patterns(model, head, algorithm=name)
  template, mask = split_model(host, patterns, algorithm=name, kept="head", shared="body")[1:]
  body = jax.tree.map(lambda m: not m, mask)

  def objective(s: LocalSetup):
    if s.optimizer is None:
      raise ValueError(f"{name}: local_optimizer=None; the body's local training needs one")
    return sgd_client_update(s.model, train_only(s.optimizer, body), batch_size=s.batch_size,
                             max_steps=s.max_steps, compute_dtype=s.compute_dtype)

  # the head is "personal" to every client so that it is never sent; nobody trains it, so every copy
  # stays the initial head, and so does every server's (no pseudo-gradient there)
  inner = host.replace(model=redrawn_head(model, mask, head_init)).build(client_update=objective,
                  personal=personal(patterns), name=name)
  topology = host.get("topology") or Topology.flat(host["data"].num_clients)
  top = int(host.get("top_level", 0) or 0)

  def models(state: TreeState):
    out = {}
    if top == 0:
      out["global"] = NodeModels(state.params[0], np.zeros(topology.num_clients, np.int32))
    for lv in range(max(top, 1), topology.depth):
      out[f"level{lv}"] = NodeModels(state.params[lv], clients_node(topology, lv, host.get("membership"),
                                                                    state.round))
    return out

  alg = inner._replace(models=models)
  frozen, body_n = parameter_counts(template, mask)
  alg = with_parameter_counts(alg, {"personal": 0, "shared": body_n, "frozen": frozen},
                              "frozen: the initial head, the same on every client, never sent")
  if tune is None:
    return alg
  trainable = {"all": None, "head": mask, "body": body}[finetune_part]
  return finetuned(alg, model=model, data=host["data"], batch_size=schedule.batch_size, learning_rate=rate,
                   steps=finetune_steps, epochs=finetune_epochs, optimizer=finetune_optimizer,
                   trainable=trainable, chunk_size=None, models=None)
