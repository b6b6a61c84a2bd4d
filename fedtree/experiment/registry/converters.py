"""The shared converters of config-only run fields (:class:`~fedtree.experiment.spec.Fields`): the
server optimizers, the tree, the cohort, a per-run learning rate, personal parameters, AFL's
domains; and the defaults a spec reads from the config (a rate, FedNova's momentum). A family's own
converters live beside it, in :mod:`fedtree.experiment.families`."""

from __future__ import annotations

import jax
import ml_collections
import numpy as np

from fedtree.experiment.builders import local_optimizer_from_config
from fedtree.experiment.registry.coercion import coerce
from fedtree.experiment.spec import Fields, check_fields, number, per_level_servers

TREES = ("flat", "config")


def servers(target: str) -> Fields:
  """``server`` (one server optimizer config ``{name, **hparams}``) and, for a factory taking one
  per server level (``target="server_optimizers"``), ``servers`` -> ``target``."""
  both = per_level_servers("servers", "server", target)
  return both if target == "server_optimizers" else Fields(("server",), both.convert)


def convert_tree(v, ctx):
  """``tree``: ``"flat"`` (the default: one server over every client) or ``"config"`` (the config's
  tree), for a factory whose ``topology`` is optional."""
  tree = v.get("tree", "flat")
  if tree not in TREES:
    raise ValueError(f"tree={tree!r}; choose one of {TREES}")
  return {"topology": None if tree == "flat" else ctx.topology}


def convert_cohort(v, ctx):
  """``cohort_size``: an int for every parent, one per parent, or ``None``/``-1`` (all of them)."""
  if "cohort_size" not in v:
    return {}
  c = v["cohort_size"]
  if c is None or (np.isscalar(c) and int(c) == -1):
    return {"cohort_size": None}
  return {"cohort_size": tuple(int(x) for x in c) if isinstance(c, (list, tuple)) else int(c)}


def rate_optimizer(field: str, target: str):
  """``target``: ``config.local``'s optimizer at the rate ``field`` (absent: the factory's default)."""

  def convert(v, ctx):
    if field not in v:
      return {}
    rate = number(v[field])
    if not isinstance(rate, jax.Array) and not (np.isfinite(rate) and rate > 0):   # (the field written)
      raise ValueError(f"{field}={rate} must be > 0 and finite")
    local = ml_collections.ConfigDict(ctx.config.local.to_dict(), type_safe=False)
    local.learning_rate = rate
    return {target: local_optimizer_from_config(local)}

  return Fields((field,), convert)


def convert_local_rate(v, ctx):
  """``local_learning_rate``: this run's clients use ``config.local``'s optimizer at this rate, and are
  told it (:attr:`fedtree.core.local.ClientRound.learning_rate`); absent: the config's."""
  if "local_learning_rate" not in v:
    return {}
  rate = number(v["local_learning_rate"])
  optimizer = rate_optimizer("local_learning_rate", "local_optimizer").convert(v, ctx)
  return {**optimizer, "local_learning_rate": rate}


def default_learning_rate(ctx):
  """A ``learning_rate`` that defaults to ``config.local``'s (pFedMe's, pFedMT's)."""
  return {"learning_rate": float(ctx.config.local.learning_rate)}


def default_momentum(ctx):
  """FedNova's ``momentum``: ``config.local``'s heavy-ball momentum (``sgd`` with ``hparams.momentum``),
  which its effective step count ``‖a_i‖₁`` depends on; another local optimizer is refused (the
  paper's ``a_i`` is for SGD with momentum)."""
  local = ctx.config.local
  hparams = dict(local.get("hparams", {}) or {})
  if local.optimizer != "sgd" or hparams.get("nesterov", False):
    raise ValueError(f"fednova normalizes by the effective steps of local SGD with heavy-ball momentum; "
                     f"config.local.optimizer={local.optimizer!r} (hparams {hparams}) is not; use "
                     f"optimizer='sgd' (hparams.momentum=ρ)")
  return {"momentum": hparams.get("momentum", 0.0) or 0.0}


def convert_personal(v, ctx):
  """``personal: {patterns: [regex, ...], level: None | int}`` (or a pattern list) ->
  :class:`~fedtree.core.personal.Personal`."""
  from fedtree.core.personal import personal

  if "personal" not in v or v["personal"] is None:
    return {}
  cfg = v["personal"]
  cfg = cfg.to_dict() if hasattr(cfg, "to_dict") else cfg
  if isinstance(cfg, (str, list, tuple)):
    cfg = {"patterns": cfg}
  check_fields("personal", list(cfg), ("patterns", "level"))
  if "patterns" not in cfg:
    raise ValueError("personal needs patterns: a regex or a list of them, matched against the parameters' "
                     "paths (e.g. ['Dense_1'] or ['.*BatchNorm.*'])")
  return {"personal": personal(cfg["patterns"], level=cfg.get("level"))}


def convert_domains(v, ctx):
  """AFL's ``domains``: ``"clients"`` (absent: every client its own domain), ``"groups"`` (the
  data's group labels) or one integer per client."""
  d = v.get("domains", "clients")
  if d is None or (isinstance(d, str) and d == "clients"):
    return {"domains": None}
  if isinstance(d, str) and d == "groups":
    return {"domains": tuple(int(g) for g in np.asarray(ctx.groups))}
  if isinstance(d, str):
    raise ValueError(f"domains={d!r}; choose 'clients', 'groups' or one integer per client")
  return {"domains": coerce(d, tuple[int, ...], "domains")}


PUBLIC_EXAMPLES = 256
"""FedDF's stand-in public inputs by default (``public_examples``)."""


def convert_public(v, ctx):
  """FedDF's ``public``: ``public_examples`` inputs (default :data:`PUBLIC_EXAMPLES`) drawn with
  ``public_seed`` (default 0), without replacement where there are enough, from every client's training
  inputs pooled: a stand-in for a public set, whose labels are never read (read from the store where
  the population streams)."""
  n = coerce(v.get("public_examples", PUBLIC_EXAMPLES), int, "public_examples")
  seed = coerce(v.get("public_seed", 0), int, "public_seed")
  if n < 1:
    raise ValueError(f"public_examples={n} must be >= 1 (the unlabeled inputs FedDF distills on)")
  data = ctx.data.require_padded("FedDF's stand-in public inputs (public_examples)")
  counts = np.asarray(data.n_train, np.int64)
  ends = np.cumsum(counts)   # the pooled rows, client by client: row i is client c's row i - ends[c - 1]
  pick = np.random.default_rng(seed).choice(int(ends[-1]), size=n, replace=n > int(ends[-1]))
  client = np.searchsorted(ends, pick, side="right")
  row = pick - (ends[client] - counts[client])
  if data.window is None:
    return {"public": np.asarray(data.x_train)[client, row]}
  held, at = np.unique(client, return_inverse=True)   # a streamed population: the picked clients' rows
  block = ctx.population.store.read(held, "train", width=int(counts[held].max()))
  return {"public": block.x[at, row]}
