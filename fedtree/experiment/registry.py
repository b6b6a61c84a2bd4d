"""Every algorithm a run config can name, and the one generic way from ``config.runs.<label>``
to that algorithm.

An algorithm's config schema is declared once, by its factory's keyword-only signature (typed
defaults; GroupPerFL: its frozen dataclass). :data:`SPECS` lists every algorithm explicitly
(no registry filled by import side effects); :func:`build_algorithm` maps a run's fields onto
the factory:

* the context supplies ``model``, ``data``, ``local_optimizer``, ``schedule``, the config's
  ``topology`` (when the factory requires one) and ``name`` (the run's ``algorithm``);
* a scalar parameter (``int``, ``float``, ``bool``, ``str``, ``None`` or tuples of them) is a
  run field of the same name, coerced to the annotated type;
* the non-scalar parameters (optimizers, per-level lists, latencies, proxy data) are set by
  small named converters (:class:`~fedtree.experiment.spec.Fields`) from config-only fields:
  the shared ones here, a family's own beside it in :mod:`fedtree.experiment.families` (B-HFL's
  seven, GroupPerFL's), whose ``SPEC`` this module lists;
* every other field is an error naming the run, the field and the allowed fields.

Common run fields, for every algorithm whose factory takes the parameter: ``cohort_size`` (per leaf
parent; -1 or absent: all), the sections of the capabilities the algorithm takes
(:data:`fedtree.experiment.capabilities.CAPABILITIES`: ``privacy``, ``attack``, ``aggregator``,
``compression`` for the algorithms that take ``update_paths``, ``systems`` for those that take
``systems``, ``adapters`` where the spec says so), ``chunk_size`` (an int, ``None``, ``"auto"`` or ``"tune"``;
default the config's, else ``"auto"``), ``compute_dtype`` (default the config's), ``init_params``
(the path of saved parameters to start from, default the config's ``init_params``:
:mod:`fedtree.experiment.params`; every algorithm takes it, GroupPerFL in its first stage),
``weighting``, ``server`` (one server optimizer config ``{name, **hparams}``) / ``servers`` (one
per server level), ``local_learning_rate`` (the methods over the HierFAVG host: this run's clients use
``config.local``'s optimizer at this rate, and are told it, as a benchmark's table tunes it per
method),
``periods``, ``tree`` (``"flat"`` or ``"config"``, for the methods whose tree is optional),
``objective`` (for the algorithms that take a ``client_update``: the local objective, ``{name,
**hyperparameters}``, see :func:`objective_from_config`), and the runner's ``rounds`` and
``label``.

Adding an algorithm: its factory (one file) and one :class:`AlgorithmSpec` line in
:data:`SPECS` (see ``CONTRIBUTING.md``). A run may also name a factory of the user's own module,
``algorithm: "my_methods.scaffold:scaffold"`` (or an :class:`AlgorithmSpec` there): its signature
is its schema exactly as for the built-in ones (:func:`spec_of`).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

import jax
import ml_collections
import numpy as np

from fedtree import algorithms, objectives
from fedtree.core.topology import Topology
from fedtree.experiment import capabilities as caps
from fedtree.experiment.builders import (
  cohort_slots,
  local_optimizer_from_config,
  resolve_chunk_size,
  server_from_config,
)
from fedtree.experiment.capability import Capability, RunContext, Wrapping, compose
from fedtree.experiment.families import bhfl as bhfl_family
from fedtree.experiment.families import grouppfl as grouppfl_family
from fedtree.experiment.fields import run_field
from fedtree.experiment.spec import AlgorithmSpec, Fields, check_fields, number

RUNNER_FIELDS = ("algorithm", "label", "rounds", "data", "model")
"""Run fields the runner reads: ``data`` and ``model`` are the run's own overrides of ``config.data``
and ``config.model`` (:func:`fedtree.experiment.context.run_context`)."""
CONTEXT_PARAMS = ("model", "data", "local_optimizer", "schedule", "name", "local_learning_rate")
NOT_CONFIGURABLE = ("client_update", "init_params", "update_paths")
"""Factory parameters that are not run fields of their own name: ``init_params`` is a path
that the context loads (:meth:`fedtree.experiment.context.Context.initial_params`),
``update_paths`` what the capabilities' sections compose (:func:`capability_arguments`)."""
TREES = ("flat", "config")
SCALARS = (int, float, bool, str)


# ------------------------------------------------------------------------ converters
def _servers(target: str):
  def convert(v, ctx):
    if "servers" in v:
      return {target: [server_from_config(s) for s in v["servers"]]}
    if "server" in v:
      return {target: server_from_config(v["server"])}
    return {}

  return Fields(("server", "servers") if target == "server_optimizers" else ("server",), convert)


def _tree(v, ctx):
  tree = v.get("tree", "flat")
  if tree not in TREES:
    raise ValueError(f"tree={tree!r}; choose one of {TREES}")
  return {"topology": None if tree == "flat" else ctx.topology}


def run_topology(label: str, run, ctx) -> Topology:
  """The tree run ``label``'s algorithm is built on, which its capabilities read
  (:class:`~fedtree.experiment.capability.RunContext`): the config's tree for a factory that
  requires ``topology`` (HierFAVG, B-HFL, pFedMT); for one whose ``topology`` is optional, the
  run's ``tree`` field (``"flat"``, the default: one server over every client; ``"config"``: the
  config's); the spec's own ``tree`` (GroupPerFL: its data groups); else one server over every
  client (FedAvg, FedOpt, the clustered family)."""
  spec = _spec(label, run)
  if spec.tree is not None:
    return spec.tree(run, ctx)
  flat = Topology.flat(int(ctx.data.num_clients))
  topo = inspect.signature(spec.factory).parameters.get("topology")
  if topo is None:
    return flat
  if topo.default is inspect.Parameter.empty:
    return ctx.topology
  return _tree({"tree": run["tree"]} if "tree" in run else {}, ctx)["topology"] or flat


def _cohort(v, ctx):
  if "cohort_size" not in v:
    return {}
  c = v["cohort_size"]
  if c is None or (np.isscalar(c) and int(c) == -1):
    return {"cohort_size": None}
  return {"cohort_size": tuple(int(x) for x in c) if isinstance(c, (list, tuple)) else int(c)}


def _rate_optimizer(field: str, target: str):
  """``target``: ``config.local``'s optimizer at the rate ``field`` (absent: the factory's default)."""

  def convert(v, ctx):
    if field not in v:
      return {}
    local = ml_collections.ConfigDict(ctx.config.local.to_dict(), type_safe=False)
    local.learning_rate = number(v[field])
    return {target: local_optimizer_from_config(local)}

  return Fields((field,), convert)


def _run_local_rate(v, ctx):
  """``local_learning_rate``: this run's clients use ``config.local``'s optimizer at this rate, and are
  told it (:attr:`fedtree.core.local.ClientRound.learning_rate`); absent: the config's."""
  if "local_learning_rate" not in v:
    return {}
  rate = number(v["local_learning_rate"])
  optimizer = _rate_optimizer("local_learning_rate", "local_optimizer").convert(v, ctx)
  return {**optimizer, "local_learning_rate": rate}


def _local_rate(ctx):
  return {"learning_rate": float(ctx.config.local.learning_rate)}


def _local_momentum(ctx):
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


def _personal(v, ctx):
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


def _domains(v, ctx):
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


# ------------------------------------------------------------------------ memory needs
def _fedem_memory(kw: dict, ctx):
  """FedEM: ``K`` components at every node of the tree, ``K`` models trained per client step."""
  from fedtree.experiment.memory import Needs, tree_bytes

  k = int(kw["num_components"])
  topology = kw["topology"]
  nodes = sum(topology.num_nodes(lv) for lv in range(topology.depth))
  one = tree_bytes(jax.eval_shape(ctx.model.init, jax.random.key(0)))
  return Needs(step_models=k, parts=((f"FedEM's {k} components at {nodes} node(s)", k * nodes * one),),
               eval_models=k)


def _knnper_memory(kw: dict, ctx):
  """kNN-Per: every client's memory of its examples' features
  (:func:`fedtree.algorithms.knnper.memory_shapes`)."""
  from fedtree.algorithms.knnper import memory_shapes
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


def _pairwise_memory(method: str):
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


# ------------------------------------------------------------------------ the registry
SPECS: Mapping[str, AlgorithmSpec] = {
  "fedavg": AlgorithmSpec(algorithms.fedavg, takes=("adapters",)),
  "fedopt": AlgorithmSpec(algorithms.fedavg, takes=("adapters",)),
  "hierfavg": AlgorithmSpec(algorithms.hierfavg, takes=("adapters",)),
  "fedbuff": AlgorithmSpec(algorithms.fedbuff),
  "fedprox": AlgorithmSpec(algorithms.fedprox, takes=("adapters",)),
  "fedmmd": AlgorithmSpec(algorithms.fedmmd),
  "ditto": AlgorithmSpec(algorithms.ditto, takes=("adapters",),
                         fields=(_rate_optimizer("personal_learning_rate", "personal_optimizer"),)),
  "pfedme": AlgorithmSpec(algorithms.pfedme, defaults=_local_rate),
  "perfedavg": AlgorithmSpec(algorithms.perfedavg),
  "pfedmt": AlgorithmSpec(algorithms.pfedmt, defaults=_local_rate),
  "bhfl": bhfl_family.SPEC,
  "cfl": AlgorithmSpec(algorithms.cfl),
  "ifca": AlgorithmSpec(algorithms.ifca),
  "awcfl": AlgorithmSpec(algorithms.awcfl),
  "mcfl": AlgorithmSpec(algorithms.mcfl),
  "scaffold": AlgorithmSpec(algorithms.scaffold, takes=("adapters",)),
  "feddyn": AlgorithmSpec(algorithms.feddyn),
  "fednova": AlgorithmSpec(algorithms.fednova, defaults=_local_momentum),
  "mime": AlgorithmSpec(algorithms.mime),
  "mimelite": AlgorithmSpec(algorithms.mimelite),
  "moon": AlgorithmSpec(algorithms.moon),
  "qffl": AlgorithmSpec(algorithms.qffl),
  "afl": AlgorithmSpec(algorithms.afl, fields=(Fields(("domains",), _domains),)),
  "fedasync": AlgorithmSpec(algorithms.fedasync),
  "apfl": AlgorithmSpec(algorithms.apfl,
                        fields=(_rate_optimizer("personal_learning_rate", "personal_optimizer"),)),
  "fedala": AlgorithmSpec(algorithms.fedala),
  "fedem": AlgorithmSpec(algorithms.fedem, memory=_fedem_memory),
  "knnper": AlgorithmSpec(algorithms.knnper, memory=_knnper_memory),
  "fedamp": AlgorithmSpec(algorithms.fedamp, memory=_pairwise_memory("fedamp")),
  "fedfomo": AlgorithmSpec(algorithms.fedfomo, memory=_pairwise_memory("fedfomo")),
  "pfedhn": AlgorithmSpec(algorithms.pfedhn, memory=_pairwise_memory("pfedhn")),
  "fedproto": AlgorithmSpec(algorithms.fedproto),
  "fedkws": AlgorithmSpec(algorithms.fedkws,
                          fields=(_rate_optimizer("private_learning_rate", "private_optimizer"),)),
  "grouppfl": grouppfl_family.SPEC,
  # partial personalization (issue 37)
  "fedper": AlgorithmSpec(algorithms.fedper),
  "fedrep": AlgorithmSpec(algorithms.fedrep),
  "lgfedavg": AlgorithmSpec(algorithms.lgfedavg),
  "fedbn": AlgorithmSpec(algorithms.fedbn),
  "fedrod": AlgorithmSpec(algorithms.fedrod),
  "fedbabu": AlgorithmSpec(algorithms.fedbabu),
  "local": AlgorithmSpec(algorithms.local),
  # methods on LoRA adapters (issue 50): they need the run's adapters section
  "ffa_lora": AlgorithmSpec(algorithms.ffa_lora, takes=("adapters",)),
  "fedsa_lora": AlgorithmSpec(algorithms.fedsa_lora, takes=("adapters",)),
  "hetlora": AlgorithmSpec(algorithms.hetlora, takes=("adapters",)),
}


# ------------------------------------------------------------------------ X + FT
FINETUNE_FIELDS: Mapping[str, Any] = {
  "finetune_steps": int, "finetune_epochs": float, "finetune_learning_rate": float,
  "finetune_params": str | tuple[str, ...], "finetune_models": str | tuple[str, ...],
}
"""Run fields of every algorithm (that has no fine-tuning of its own) that fine-tune its models per
client before evaluation (:func:`fedtree.algorithms.finetuned.finetuned`): ``finetune_steps`` or
``finetune_epochs`` (0: none), ``finetune_learning_rate`` (default ``config.local.learning_rate``),
``finetune_params`` (patterns of the parameters fine-tuned; default all), ``finetune_models`` (the
models fine-tuned; default all). ``runs.fedavg_ft = {algorithm: fedavg, finetune_steps: 20}`` is
FedAvg + FT (its ``global_ft`` model)."""


def with_finetune(label: str, run, ctx, built):
  """``built`` fine-tuned per client before evaluation as run ``label``'s :data:`FINETUNE_FIELDS`
  say (``built`` itself when it sets none)."""
  from fedtree.algorithms.finetuned import finetuned
  from fedtree.algorithms.partial import mask_of

  given = {n: run[n] for n in FINETUNE_FIELDS if n in run and run[n] is not None}
  if not given:
    return built
  where = f"config.runs.{label}"
  kw = {n: coerce(v, FINETUNE_FIELDS[n], f"{where}.{n}") for n, v in given.items()}
  kw = {n: (v,) if n in ("finetune_params", "finetune_models") and isinstance(v, str) else v
        for n, v in kw.items()}
  trainable = None
  if "finetune_params" in kw:
    template = jax.eval_shape(ctx.model.init, jax.random.key(0))
    trainable = mask_of(kw["finetune_params"], template, algorithm=f"{where}.finetune_params")
  rate = kw.get("finetune_learning_rate", number(ctx.config.local.learning_rate))
  return finetuned(built, model=ctx.model, data=ctx.data, batch_size=ctx.schedule.batch_size,
                   learning_rate=rate, steps=kw.get("finetune_steps", 0),
                   epochs=kw.get("finetune_epochs", 0.0),
                   optimizer=str(ctx.config.local.get("optimizer", "sgd")), trainable=trainable,
                   models=kw.get("finetune_models"))


# ------------------------------------------------------------------------ a run's memory needs
def memory_needs(label: str, run, ctx):
  """What run ``label``'s method holds beyond one model's client step
  (:class:`fedtree.experiment.memory.Needs`, from its spec's ``memory``), or ``None``: its factory's
  defaults, the run's scalar fields and its tree."""
  spec = _spec(label, run)
  if spec.memory is None:
    return None
  params = inspect.signature(spec.factory).parameters
  kw = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
  for n, hint in schema(spec).scalars.items():
    if n in run:
      kw[n] = coerce(run[n], hint, f"config.runs.{label}.{n}")
  if "cohort_size" in params:   # (a field of its own, one size or one per parent, not a scalar)
    kw.update(_cohort(run, ctx))
  kw["topology"] = run_topology(label, run, ctx)
  return spec.memory(kw, ctx)


# ------------------------------------------------------------------------ objectives
OBJECTIVES: Mapping[str, Callable[..., Any]] = {
  "alo": objectives.alo_update, "ditto": objectives.ditto_update, "fedprox": objectives.fedprox_update,
  "moreau": objectives.moreau_client_update, "perfedavg": objectives.perfedavg_update,
  "pfedme": objectives.pfedme_update,
}
"""Local objectives a run can select with ``objective: {name: <key>, **hyperparameters}``."""
OBJECTIVE_CONTEXT = ("model", "optimizer", "batch_size", "max_steps", "compute_dtype")


def objective_from_config(cfg, ctx, *, compute_dtype: str | None = None):
  """The :class:`~fedtree.core.local.ClientUpdate` of a run's ``objective`` field:
  ``{name: one of OBJECTIVES, **its scalar hyperparameters}`` (e.g. ``{name: "fedprox", mu:
  0.01, persistent: True}`` for FedProx clients under B-HFL). The context supplies the model,
  the local optimizer, the schedule's batch size and step count, and ``compute_dtype`` (the
  run's, unless the objective sets its own)."""
  cfg = dict(cfg.to_dict() if hasattr(cfg, "to_dict") else cfg)
  name = cfg.pop("name", None)
  if name not in OBJECTIVES:
    raise ValueError(f"objective name={name!r}; choose one of {sorted(OBJECTIVES)}")
  if name == "alo" and cfg.get("private", "persistent") == "head":  # refused here, not at compile time
    raise ValueError("objective 'alo' with private='head' trains a second classifier head that the "
                     "host's model must carry: select it through the fedkws algorithm "
                     "(algorithm: fedkws, private: head), or use private='persistent'")
  factory = OBJECTIVES[name]
  params, hints = inspect.signature(factory).parameters, _hints(factory)
  supplied = {"model": ctx.model, "optimizer": ctx.local_optimizer, "batch_size": ctx.schedule.batch_size,
              "max_steps": ctx.schedule.max_steps(ctx.data.max_train),
              "compute_dtype": cfg.pop("compute_dtype", compute_dtype)}
  allowed = [n for n in params if n not in OBJECTIVE_CONTEXT and is_scalar(hints.get(n, object))]
  check_fields(f"objective {name!r}", list(cfg), allowed)
  kw = {n: v for n, v in supplied.items() if n in params}
  kw.update({n: coerce(v, hints[n], f"objective.{n}") for n, v in cfg.items()})
  missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in kw]
  if missing:
    raise ValueError(f"objective {name!r} needs field(s) {missing}")
  return factory(**kw)


# ------------------------------------------------------------------------ the schema
def _union_args(hint) -> tuple:
  if typing.get_origin(hint) in (typing.Union, types.UnionType):
    return typing.get_args(hint)
  return (hint,)


def _sequence_arg(args):
  for a in args:
    if typing.get_origin(a) in (tuple, list, collections.abc.Sequence):
      inner = [x for x in typing.get_args(a) if x is not Ellipsis]
      return inner[0] if inner else Any
  return None


def is_scalar(hint) -> bool:
  """A hint a config value can be coerced to: scalars, ``None``, tuples of scalars."""
  args = [a for a in _union_args(hint) if a is not type(None)]
  if not args:
    return False
  for a in args:
    if a in SCALARS:
      continue
    inner = _sequence_arg([a])
    if inner is None or not is_scalar(inner):
      return False
  return True


def coerce(value, hint, where: str):
  """``value`` (from an ml_collections config) as the annotated type ``hint``.

  A ``jax.Array`` (a swept hyperparameter, possibly a tracer inside ``jax.vmap``) passes
  through unchanged: its concrete values are checked before tracing.
  """
  if isinstance(value, jax.Array):
    return value
  args = _union_args(hint)
  if value is None:
    if type(None) in args:
      return None
    raise ValueError(f"{where}=None; it must be a {_type_name(hint)}")
  if isinstance(value, (list, tuple)):
    inner = _sequence_arg(args)
    if inner is None:
      raise ValueError(f"{where}={value!r}; it must be a {_type_name(hint)}, not a sequence")
    return tuple(coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value))
  if bool in args and isinstance(value, (bool, np.bool_)):
    return bool(value)
  is_number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
  if int in args and is_number and (float not in args or isinstance(value, (int, np.integer))):
    if float(value) != int(value):
      raise ValueError(f"{where}={value!r}; it must be an integer")
    return int(value)
  if float in args and is_number:
    return float(value)
  if str in args and isinstance(value, str):
    return value
  if any(a is Any for a in args):
    return value
  raise ValueError(f"{where}={value!r}; it must be a {_type_name(hint)}")


def _type_name(hint) -> str:
  return str(hint).replace("typing.", "").replace("collections.abc.", "")


@dataclasses.dataclass(frozen=True)
class Schema:
  """The run fields of one algorithm: scalar parameters (name -> hint), converters, the
  parameters the context or a converter supplies, and the capabilities' sections it takes."""

  params: Mapping[str, inspect.Parameter]
  scalars: Mapping[str, Any]
  fields: tuple[Fields, ...]
  sections: tuple[str, ...] = ()

  @property
  def own_finetune(self) -> bool:
    """Whether the factory takes fine-tuning parameters of its own (FedBABU's); the others take the
    common fine-tune-before-evaluation fields (:data:`FINETUNE_FIELDS`)."""
    return bool(set(FINETUNE_FIELDS) & set(self.params))

  @property
  def allowed(self) -> list[str]:
    names = set(RUNNER_FIELDS) | {"chunk_size", "init_params"} | set(self.scalars) | set(self.sections)
    if not self.own_finetune:
      names |= set(FINETUNE_FIELDS)
    if "client_update" in self.params:
      names.add("objective")
    for f in self.fields:
      names |= set(f.names)
    return sorted(names)


def _hints(factory) -> dict[str, Any]:
  target = factory.__init__ if inspect.isclass(factory) else factory
  try:
    return typing.get_type_hints(target)
  except Exception:  # an annotation that does not resolve: treat every parameter as untyped
    return {}


def schema(spec: AlgorithmSpec, capabilities: Mapping[str, Capability] = caps.CAPABILITIES) -> Schema:
  """The run fields of ``spec`` (see the module docstring), with the sections of the
  ``capabilities`` it takes (:meth:`~fedtree.experiment.capability.Capability.takes`)."""
  params = {n: p for n, p in inspect.signature(spec.factory).parameters.items()
            if p.kind is not inspect.Parameter.VAR_KEYWORD}
  hints = _hints(spec.factory)
  fields = list(spec.fields)
  converted = {n for f in fields for n in f.names}
  common = []
  if "cohort_size" in params:
    common.append(Fields(("cohort_size",), _cohort))
  if "server_optimizers" in params:
    common.append(_servers("server_optimizers"))
  elif "server_optimizer" in params:
    common.append(_servers("server_optimizer"))
  topo = params.get("topology")
  if topo is not None and topo.default is None:
    common.append(Fields(("tree",), _tree))
  if "local_optimizer" in params and "local_learning_rate" in params:   # a per-run client learning rate
    common.append(Fields(("local_learning_rate",), _run_local_rate, ("local_optimizer",)))
  if "personal" in params:   # parameters kept per client or per subtree (fedtree.core.personal)
    common.append(Fields(("personal",), _personal))
  fields = [f for f in common if not set(f.names) & converted] + fields
  skip = set(CONTEXT_PARAMS) | set(NOT_CONFIGURABLE) | {"chunk_size", "topology"}
  skip |= {n for f in fields for n in f.names + f.targets}
  skip |= {c.argument for c in capabilities.values() if c.argument is not None}
  scalars = {n: hints.get(n, Any) for n, p in params.items()
             if n not in skip and n in hints and is_scalar(hints[n])}
  sections = tuple(n for n, c in capabilities.items() if c.takes(spec))
  return Schema(params=params, scalars=scalars, fields=tuple(fields), sections=sections)


def _run_label(run, ctx) -> str:
  for label, cfg in ctx.config.runs.items():
    if cfg is run:
      return label
  return run.get("label", run.algorithm)


def spec_of(name: str) -> AlgorithmSpec:
  """The spec of algorithm ``name``: a key of :data:`SPECS`, or ``"module:attribute"`` naming a
  factory (or an :class:`AlgorithmSpec`) of the user's own module, imported from ``sys.path``
  (``python -m fedtree.main`` puts the working directory there): its signature is its schema,
  exactly as a built-in factory's (:func:`fedtree.algorithms.hierfavg.hierfavg_method` methods
  included)."""
  if name in SPECS:
    return SPECS[name]
  if not isinstance(name, str) or ":" not in name:
    raise KeyError(name)
  obj = caps.load(name)
  if isinstance(obj, AlgorithmSpec):
    return obj
  if not callable(obj):
    raise ValueError(f"{name!r} is a {type(obj).__name__}, not an algorithm factory nor an AlgorithmSpec")
  return AlgorithmSpec(obj)


def factory_name(name: str) -> str:
  """The ``name`` an algorithm's factory is given for run field ``algorithm=name``: the name
  itself, or the attribute of a ``"module:attribute"`` path."""
  return name.rpartition(":")[2].rpartition(".")[2] if ":" in str(name) else name


def _spec(label: str, run) -> AlgorithmSpec:
  if "algorithm" not in run:
    raise ValueError(f"config.runs.{label} has no 'algorithm' field; choose one of {sorted(SPECS)} "
                     f"or a factory of your own as 'module:function'")
  try:
    return spec_of(run.algorithm)
  except KeyError:
    raise ValueError(
      f"config.runs.{label}.algorithm={run.algorithm!r} is unknown; choose one of {sorted(SPECS)} or a "
      f"factory of your own as 'module:function'") from None
  except ValueError as e:
    raise ValueError(f"config.runs.{label}.algorithm: {e}") from e


def algorithms_taking(capability: Capability) -> list[str]:
  """The algorithms of :data:`SPECS` whose runs take ``capability``'s section."""
  return sorted(n for n, spec in SPECS.items() if capability.takes(spec))


def validate_run(label: str, run, capabilities: Mapping[str, Capability] = caps.CAPABILITIES) -> None:
  """Named errors for an unknown algorithm or an unknown field of ``config.runs.<label>``, and
  for the section of a capability its algorithm does not take (naming those that take it)."""
  spec = _spec(label, run)
  sch = schema(spec, capabilities)
  for name, cap in capabilities.items():
    if name in run and name not in sch.sections:
      raise ValueError(f"config.runs.{label}: unknown field {name!r}: algorithm {run.algorithm!r} cannot run "
                       f"a {name!r} section ({cap.about}); the algorithms that take it: "
                       f"{algorithms_taking(cap)}")
  check_fields(f"config.runs.{label} (algorithm={run.algorithm!r})", list(run.keys()), sch.allowed)


def run_context(ctx, label: str, run) -> RunContext:
  """What the capabilities of run ``label`` (its ``config.runs.<label>``) see: the shared context
  with the run's own tree (:func:`run_topology`), its factory and the factory's parameters."""
  if isinstance(ctx, RunContext) and ctx.run is run:
    return ctx
  spec = _spec(label, run)
  params = {n: p for n, p in inspect.signature(spec.factory).parameters.items()
            if p.kind is not inspect.Parameter.VAR_KEYWORD}
  shared = ctx.shared if isinstance(ctx, RunContext) else ctx
  return RunContext(shared, label, run, params, topology=run_topology(label, run, shared),
                    factory=spec.factory)


def _named(e: ValueError, where: str, name: str) -> ValueError:
  """A capability's refusal named by its run and section (unless it names its field already)."""
  msg = str(e)
  if msg.startswith("config."):
    return e
  if not msg.startswith((f"{name}:", f"{name}.")):
    msg = f"{name}: {msg}"
  return ValueError(f"{where}: {msg}")


def capability_arguments(label: str, run, ctx) -> dict[str, Any]:
  """The factory arguments the capabilities of run ``label`` fill, each section converted once on
  the run's context (:func:`run_context`): ``update_paths`` (every capability's update-path parts,
  composed per level in :data:`~fedtree.experiment.capabilities.CAPABILITIES` order) and each
  capability's ``argument`` (``systems``)."""
  capabilities = caps.of_config(ctx.config)
  present = caps.sections(run, capabilities)
  if not present:
    return {}
  rctx = run_context(ctx, label, run)
  where = f"config.runs.{label} (algorithm={run.algorithm!r})"
  parts, out = {}, {}
  for cap, section in present:
    try:
      if cap.parts is not None:
        parts[cap.name] = cap.parts(section, rctx)
      if cap.value is not None:
        out[cap.argument] = cap.value(section, rctx)
    except ValueError as e:
      raise _named(e, where, cap.name) from e
  if parts:
    try:
      out["update_paths"] = compose(parts, list(capabilities))
    except ValueError as e:
      raise ValueError(f"{where}: {e}") from e
  return out


def factory_kwargs(label: str, run, ctx, *, arguments: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """The keyword arguments of run ``label``'s factory (validated, coerced, converted), with the
  arguments its capabilities fill (``arguments``: :func:`capability_arguments`, computed here when
  ``None``)."""
  spec = _spec(label, run)
  capabilities = caps.of_config(ctx.config)
  validate_run(label, run, capabilities)
  ctx = _run_context(label, run, ctx)
  sch = schema(spec, capabilities)
  params = sch.params
  where = f"config.runs.{label}"
  kw: dict[str, Any] = {}
  supplied = {"model": ctx.model, "data": ctx.data, "local_optimizer": ctx.local_optimizer,
              "schedule": ctx.schedule, "name": factory_name(run.algorithm), "topology": ctx.topology,
              "label": run.get("label", run.algorithm),
              "local_learning_rate": ctx.config.local.learning_rate}
  for n, v in supplied.items():
    if n in params:
      kw[n] = v
  if "chunk_size" in params:
    kw["chunk_size"] = ctx.chunk_size(run)
  if "compute_dtype" in params:
    dtype = run_field(ctx.config, run, "compute_dtype")
    if dtype is not None:
      kw["compute_dtype"] = dtype
  if "init_params" in params:
    init = ctx.initial_params(run, label)
    if init is not None:
      kw["init_params"] = init
  if spec.defaults is not None:
    kw.update(spec.defaults(ctx))
  for n, hint in sch.scalars.items():
    if n in run:
      kw[n] = coerce(run[n], hint, f"{where}.{n}")
  for f in sch.fields:
    try:
      kw.update(f.convert({n: run[n] for n in f.names if n in run}, ctx))
    except ValueError as e:
      raise ValueError(f"{where} (algorithm={run.algorithm!r}): {e}") from e
  kw.update(capability_arguments(label, run, ctx) if arguments is None else arguments)
  if "objective" in run:   # the objective is built with the run's compute_dtype, the host without
    try:
      dtype = kw.pop("compute_dtype", None)
      kw["client_update"] = objective_from_config(run.objective, ctx, compute_dtype=dtype)
    except ValueError as e:
      raise ValueError(f"{where} (algorithm={run.algorithm!r}): {e}") from e
  missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in kw]
  if missing:
    raise ValueError(f"{where} (algorithm={run.algorithm!r}) needs field(s) {missing}")
  return kw


def _run_context(label: str, run, ctx):
  """The context run ``label`` builds in: ``ctx``, or with the run's own ``data``/``model``
  (the context's ``for_run``, :func:`fedtree.experiment.context.run_context`, which returns a
  run's context unchanged)."""
  if run.get("data", None) is None and run.get("model", None) is None:
    return ctx
  try:
    return ctx.for_run(run)
  except ValueError as e:
    raise ValueError(f"config.runs.{label}: {e}") from e


def _tune_slots(kw: dict, ctx) -> int:
  topology = kw.get("topology") or Topology.flat(ctx.data.num_clients)
  return cohort_slots(kw.get("cohort_size"), topology.leaf_counts(topology.depth - 1))


def build_algorithm(label: str, run_cfg, ctx, *, arguments: Mapping[str, Any] | None = None):
  """The :class:`~fedtree.core.algorithm.FederatedAlgorithm` of run ``label`` (its
  ``config.runs.<label>``) on the shared context (with its ``report`` hook where the spec's
  ``wrap`` adds one: B-HFL's table by level, GroupPerFL's fine-tune stage and tables), its
  capabilities' arguments filled (``arguments``, else converted here) and wrapped by a capability
  that changes the model it trains (:func:`wrapping`)."""
  spec = _spec(label, run_cfg)
  ctx = _run_context(label, run_cfg, ctx)
  wrapped = wrapping(label, run_cfg, ctx)
  if wrapped is not None:
    arguments = capability_arguments(label, run_cfg, ctx) if arguments is None else arguments
    return wrapped_algorithm(label, *wrapped, ctx, arguments)
  kw = factory_kwargs(label, run_cfg, ctx, arguments=arguments)
  if kw.get("chunk_size") == "tune":
    kw = resolve_chunk_size(kw, _tune_slots(kw, ctx), spec.factory, ctx)
  try:
    built = spec.factory(**kw)
    if spec.wrap is not None:
      built = spec.wrap(built, label, run_cfg, ctx)
    if not schema(spec).own_finetune:
      built = with_finetune(label, run_cfg, ctx, built)
  except ValueError as e:  # the factory's refusal, named by its run
    if str(e).startswith("config."):
      raise
    raise ValueError(f"config.runs.{label} (algorithm={run_cfg.algorithm!r}): {e}") from e
  return built


def wrapped_algorithm(label: str, inner_run, wrap: Wrapping, ctx, arguments: Mapping[str, Any]):
  """Run ``label``'s algorithm as ``wrap`` makes it: the inner run (:func:`wrapping`) built on the
  model it is given, with the capabilities' ``arguments`` converted once on the run's context."""

  def make(model):
    return build_algorithm(label, inner_run, dataclasses.replace(ctx, model=model, init_params=None),
                           arguments=arguments)

  return wrap.build(make)


def wrapping(label: str, run_cfg, ctx) -> tuple[Any, Wrapping] | None:
  """``(the run without the section, its Wrapping)`` of the capability that changes the model run
  ``label`` trains (LoRA's ``adapters``), or ``None``: the inner run (without its ``init_params``,
  which the capability reads: a base, not the inner model's start) is built on the model the
  :class:`~fedtree.experiment.capability.Wrapping` gives."""
  capabilities = caps.of_config(ctx.config)
  wraps = [(c, s) for c, s in caps.sections(run_cfg, capabilities) if c.wrap is not None]
  if not wraps:
    return None
  validate_run(label, run_cfg, capabilities)
  if len(wraps) > 1:
    raise ValueError(f"config.runs.{label}: sections {[c.name for c, _ in wraps]} each change the model the "
                     f"run trains; give one of them")
  cap, section = wraps[0]
  if any(n in run_cfg for n in FINETUNE_FIELDS):
    raise ValueError(f"config.runs.{label}: fine-tuning before evaluation (finetune_*) does not run on "
                     f"{cap.name}; drop one of them")
  try:
    wrap = cap.wrap(section, run_context(ctx, label, run_cfg))
  except ValueError as e:
    raise _named(e, f"config.runs.{label} (algorithm={run_cfg.algorithm!r})", cap.name) from e
  inner_run = ml_collections.ConfigDict(
    {k: v for k, v in run_cfg.items() if k not in (cap.name, "init_params")})
  return inner_run, wrap


def validate_runs(config) -> None:
  """Early, named errors for every run of ``config``: unknown or missing ``algorithm``, and
  fields the algorithm does not know (with a did-you-mean)."""
  capabilities = caps.of_config(config)
  for label, run_cfg in config.runs.items():
    validate_run(label, run_cfg, capabilities)


def _builder(name: str):
  def build(run, ctx):
    return build_algorithm(_run_label(run, ctx), run, ctx)

  build.__name__ = f"build_{name}"
  return build


BUILDERS = {name: _builder(name) for name in SPECS}
"""``BUILDERS[name](run_config, context)``: :func:`build_algorithm` by algorithm name."""
