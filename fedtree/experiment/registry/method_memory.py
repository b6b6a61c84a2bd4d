"""What a method holds beyond one model's client step, for the up-front memory estimate
(:class:`fedtree.experiment.memory.Needs`, a spec's ``memory``): FedEM's components, kNN-Per's
memory of features, the pairwise methods' buffers over a round's cohort."""

from __future__ import annotations

import jax
import numpy as np


def fedem_needs(kw: dict, ctx):
  """FedEM: ``K`` components at every node of the tree, ``K`` models trained per client step."""
  from fedtree.experiment.memory import Needs, tree_bytes

  k = int(kw["num_components"])
  topology = kw["topology"]
  nodes = sum(topology.num_nodes(lv) for lv in range(topology.depth))
  one = tree_bytes(jax.eval_shape(ctx.model.init, jax.random.key(0)))
  return Needs(step_models=k, parts=((f"FedEM's {k} components at {nodes} node(s)", k * nodes * one),),
               eval_models=k)


def knnper_needs(kw: dict, ctx):
  """kNN-Per: every client's memory of its examples' features
  (:func:`fedtree.algorithms.personalized.knnper.memory_shapes`)."""
  from fedtree.algorithms.personalized.knnper import memory_shapes
  from fedtree.experiment.memory import Needs, tree_bytes

  shapes = memory_shapes(ctx.model, ctx.data)
  c, m, d = shapes.features.shape
  queries = int(np.shape(ctx.data.x_test)[1])   # an evaluated client's distances and query features
  scratch = queries * (m + d) * np.dtype(shapes.features.dtype).itemsize
  return Needs(parts=((f"kNN-Per's memory ({c} clients x {m} examples x {d} features)", tree_bytes(shapes)),),
               eval_client_bytes=scratch)


def _cohort_shape(kw: dict) -> tuple[int, int, int]:
  """``(K, N, B)``: the slots of a round's cohort, the clients' parents and the largest cohort of a
  parent, for a run's ``cohort_size`` (one or per parent; ``None``: every child) on its tree."""
  topology = kw["topology"]
  counts = np.bincount(topology.parent(topology.depth), minlength=topology.num_nodes(topology.depth - 1))
  cohort = kw.get("cohort_size")
  if cohort is not None:
    counts = np.minimum(np.broadcast_to(np.asarray(cohort, np.int64), counts.shape), counts)
  sizes = counts
  return int(sizes.sum()), len(counts), int(sizes.max())


def pairwise_needs(method: str):
  """FedAMP's, FedFomo's and pFedHN's buffers over a round's cohort
  (:class:`fedtree.experiment.memory.Needs`)."""
  def needs(kw: dict, ctx):
    from fedtree.experiment.memory import Needs, tree_bytes

    k, n, b = _cohort_shape(kw)
    one = tree_bytes(jax.eval_shape(ctx.model.init, jax.random.key(0)))
    if method == "fedamp":
      parts = ((f"FedAMP's cohort blocks and cloud models ({k} slots, {n} x {b} blocks)",
                2 * (k + n * b) * one), (f"its attention ({n} x {b} x {b})", 2 * 4 * n * b * b))
    elif method == "fedfomo":
      m = int(kw["num_candidates"])
      parts = ((f"FedFomo's candidate models ({k} clients x {m})", k * m * one),)
    else:
      parts = ((f"pFedHN's generated and returned models ({k} slots, {n} x {b} blocks)",
                (n * b + 2 * k) * one),)
    return Needs(cohort=parts)

  return needs


def message_block_needs(what: str):
  """SCAFFOLD's and MimeLite's messages (a model's worth a client: ``Δc_i``, ``∇f_i(x)``) under a robust
  (blockwise) aggregator at the clients' tier: held in blocks beside the updates'
  (:attr:`fedtree.core.server_rule.Uplink.robust`), as :func:`fedtree.experiment.memory.block_bytes`
  counts the updates' (``what`` names them)."""
  def needs(kw: dict, ctx):
    from fedtree.core.updates import per_level_paths
    from fedtree.experiment.memory import Needs, block_bytes, tree_bytes

    topology = kw["topology"]
    path = per_level_paths(kw.get("update_paths"), topology.depth, algorithm="the method")[-1]
    if path is None or not path.aggregator.blockwise:
      return Needs()
    k, n, b = _cohort_shape(kw)
    one = tree_bytes(jax.eval_shape(ctx.model.init, jax.random.key(0)))
    return Needs(cohort=((f"{what} in the robust aggregator's blocks ({n} x {b})",
                          block_bytes(one, k, b, pairwise=False)),))

  return needs
