"""Config -> algorithm builders of the clustered-FL family (paper 004; see ``BUILDERS``).

Besides the common run fields of :mod:`fedtree.experiment.builders` (``cohort_size``,
``chunk_size``, ``weighting``, ``server``: the per-cluster server optimizer), method fields:

* ``awcfl``: ``num_clusters``, ``beta`` (0.5), ``cluster_start_round`` (20; 0 for IFCA),
  ``kmeans_iters`` (20), ``clustering`` (``kmeans``/``cfl``/``ifca``: paper 004's AWCFL,
  AWCFL_CFL, AWCFL_IFCA) and that method's fields below.
* ``mcfl``: ``num_clusters``, ``cluster_start_round``, ``kmeans_iters``,
  ``feature_examples`` (``n``, 10), ``metric`` (``l1``/``l2``), ``clustering`` as AWCFL's
  (MCFL_CFL, MCFL_IFCA).
* ``ifca``: ``num_clusters``, ``init`` (``random``/``same``).
* ``cfl``: ``max_clusters`` (4), ``eps1``, ``eps2``, ``min_split_size`` (2),
  ``split_start_round`` (0), ``similarity_check`` (true: Sattler's separation check).

With ``clustering="cfl"``, ``num_clusters`` is the most clusters CFL may form and
``eps1``/``eps2``/``min_split_size``/``similarity_check`` apply; with ``"ifca"``, ``init``.

The clustered methods ignore the config's tree (they are one-tier): every client is a row
of the data and its cluster is a dynamic parent. Each returns a ``cluster`` model set whose
summary holds intra- and inter-cluster accuracy.
"""

from __future__ import annotations

from fedtree.algorithms.clustering.awcfl import awcfl
from fedtree.algorithms.clustering.cfl import cfl
from fedtree.algorithms.clustering.ifca import ifca
from fedtree.algorithms.clustering.mcfl import mcfl
from fedtree.experiment.builders import common, resolve_chunk_size, server_from_config


def _kwargs(run, ctx, build) -> dict:
  kw = dict(server_optimizer=server_from_config(run.get("server", None)), name=run.algorithm,
            **common(run, ctx))
  slots = ctx.data.num_clients if kw["cohort_size"] is None else int(kw["cohort_size"])
  return resolve_chunk_size(kw, slots, build, ctx)


def _num_clusters(run):
  if "num_clusters" not in run:
    raise ValueError(f"run with algorithm={run.algorithm!r} needs field 'num_clusters'")
  return run.num_clusters


def _clustering_fields(run) -> dict:
  """The clustering method and its fields (AWCFL/MCFL on K-means, CFL or IFCA)."""
  clustering = run.get("clustering", "kmeans")
  out = dict(clustering=clustering, kmeans_iters=int(run.get("kmeans_iters", 20)))
  start = run.get("cluster_start_round", None)
  out["cluster_start_round"] = None if start is None else int(start)
  if clustering == "cfl":
    out.update(eps1=float(run.get("eps1", 0.4)), eps2=float(run.get("eps2", 1.6)),
               min_split_size=int(run.get("min_split_size", 2)),
               similarity_check=bool(run.get("similarity_check", True)))
  if clustering == "ifca":
    out["init"] = run.get("init", "random")
  return out


def build_awcfl(run, ctx):
  """AWCFL (paper 004, Algorithm 1), on K-means, CFL or IFCA clusters."""
  extra = dict(num_clusters=_num_clusters(run), beta=run.get("beta", 0.5), **_clustering_fields(run))
  return awcfl(**_kwargs(run, ctx, lambda **kw: awcfl(**kw, **extra)), **extra)


def build_mcfl(run, ctx):
  """MCFL (paper 004, Algorithm 2)."""
  extra = dict(num_clusters=_num_clusters(run), feature_examples=int(run.get("feature_examples", 10)),
               metric=run.get("metric", "l2"), **_clustering_fields(run))
  return mcfl(**_kwargs(run, ctx, lambda **kw: mcfl(**kw, **extra)), **extra)


def build_ifca(run, ctx):
  """IFCA (Ghosh et al. 2020)."""
  extra = dict(num_clusters=_num_clusters(run), init=run.get("init", "random"))
  return ifca(**_kwargs(run, ctx, lambda **kw: ifca(**kw, **extra)), **extra)


def build_cfl(run, ctx):
  """CFL (Sattler et al. 2020)."""
  extra = dict(max_clusters=run.get("max_clusters", 4), eps1=float(run.get("eps1", 0.4)),
               eps2=float(run.get("eps2", 1.6)), min_split_size=int(run.get("min_split_size", 2)),
               split_start_round=int(run.get("split_start_round", 0)),
               similarity_check=bool(run.get("similarity_check", True)))
  return cfl(**_kwargs(run, ctx, lambda **kw: cfl(**kw, **extra)), **extra)
