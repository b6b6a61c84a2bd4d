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
parent; -1 or absent: all), the update-path sections of :mod:`fedtree.experiment.updates` (for the
algorithms that take ``update_paths``), ``chunk_size`` (an int, ``None``, ``"auto"`` or ``"tune"``;
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
:data:`SPECS` (see ``CONTRIBUTING.md``).
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
from fedtree.experiment import updates as update_sections
from fedtree.experiment.builders import (
  cohort_slots,
  local_optimizer_from_config,
  resolve_chunk_size,
  server_from_config,
)
from fedtree.experiment.families import bhfl as bhfl_family
from fedtree.experiment.families import grouppfl as grouppfl_family
from fedtree.experiment.run_context import RunContext
from fedtree.experiment.spec import AlgorithmSpec, Fields, check_fields, number
from fedtree.experiment.systems import systems_from_config

RUNNER_FIELDS = ("algorithm", "label", "rounds", "data", "model")
"""Run fields the runner reads: ``data`` and ``model`` are the run's own overrides of ``config.data``
and ``config.model`` (:func:`fedtree.experiment.runner.run_context`)."""
CAPABILITIES = {"update_paths", "systems"}
"""Factory parameters set from capability sections, whose converters get the run's
:class:`~fedtree.experiment.run_context.RunContext` (its tree and cohort)."""
CONTEXT_PARAMS = ("model", "data", "local_optimizer", "schedule", "name", "local_learning_rate")
NOT_CONFIGURABLE = ("client_update", "init_params")
"""Factory parameters that are not run fields of their own name: ``init_params`` is a path
that the context loads (:meth:`fedtree.experiment.runner.Context.initial_params`)."""
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
  (:class:`~fedtree.experiment.run_context.RunContext`): the config's tree for a factory that
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


# ------------------------------------------------------------------------ the registry
SPECS: Mapping[str, AlgorithmSpec] = {
  "fedavg": AlgorithmSpec(algorithms.fedavg),
  "fedopt": AlgorithmSpec(algorithms.fedavg),
  "hierfavg": AlgorithmSpec(algorithms.hierfavg),
  "fedbuff": AlgorithmSpec(algorithms.fedbuff),
  "fedprox": AlgorithmSpec(algorithms.fedprox),
  "fedmmd": AlgorithmSpec(algorithms.fedmmd),
  "ditto": AlgorithmSpec(algorithms.ditto,
                         fields=(_rate_optimizer("personal_learning_rate", "personal_optimizer"),)),
  "pfedme": AlgorithmSpec(algorithms.pfedme, defaults=_local_rate),
  "perfedavg": AlgorithmSpec(algorithms.perfedavg),
  "pfedmt": AlgorithmSpec(algorithms.pfedmt, defaults=_local_rate),
  "bhfl": bhfl_family.SPEC,
  "cfl": AlgorithmSpec(algorithms.cfl),
  "ifca": AlgorithmSpec(algorithms.ifca),
  "awcfl": AlgorithmSpec(algorithms.awcfl),
  "mcfl": AlgorithmSpec(algorithms.mcfl),
  "scaffold": AlgorithmSpec(algorithms.scaffold),
  "feddyn": AlgorithmSpec(algorithms.feddyn),
  "fednova": AlgorithmSpec(algorithms.fednova, defaults=_local_momentum),
  "mime": AlgorithmSpec(algorithms.mime),
  "mimelite": AlgorithmSpec(algorithms.mimelite),
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
  """The run fields of one algorithm: scalar parameters (name -> hint), converters, and the
  parameters the context or a converter supplies."""

  params: Mapping[str, inspect.Parameter]
  scalars: Mapping[str, Any]
  fields: tuple[Fields, ...]

  @property
  def own_finetune(self) -> bool:
    """Whether the factory takes fine-tuning parameters of its own (FedBABU's); the others take the
    common fine-tune-before-evaluation fields (:data:`FINETUNE_FIELDS`)."""
    return bool(set(FINETUNE_FIELDS) & set(self.params))

  @property
  def allowed(self) -> list[str]:
    names = set(RUNNER_FIELDS) | {"chunk_size", "init_params"} | set(self.scalars)
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


def schema(spec: AlgorithmSpec) -> Schema:
  """The run fields of ``spec`` (see the module docstring)."""
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
  if "update_paths" in params:   # privacy, attacks, robust aggregation, compression (by section)
    common.append(Fields(tuple(update_sections.SECTIONS), update_sections.update_paths_from_config,
                         ("update_paths",)))
  if "local_optimizer" in params and "local_learning_rate" in params:   # a per-run client learning rate
    common.append(Fields(("local_learning_rate",), _run_local_rate, ("local_optimizer",)))
  if "personal" in params:   # parameters kept per client or per subtree (fedtree.core.personal)
    common.append(Fields(("personal",), _personal))
  if "systems" in params:   # devices, availability, round policy (fedtree.experiment.systems)
    common.append(Fields(("systems",), lambda v, ctx: {"systems": systems_from_config(v["systems"], ctx)}
                         if "systems" in v else {}))
  fields = [f for f in common if not set(f.names) & converted] + fields
  skip = set(CONTEXT_PARAMS) | set(NOT_CONFIGURABLE) | {"chunk_size", "topology"}
  skip |= {n for f in fields for n in f.names + f.targets}
  scalars = {n: hints.get(n, Any) for n, p in params.items()
             if n not in skip and n in hints and is_scalar(hints[n])}
  return Schema(params=params, scalars=scalars, fields=tuple(fields))


def _run_label(run, ctx) -> str:
  for label, cfg in ctx.config.runs.items():
    if cfg is run:
      return label
  return run.get("label", run.algorithm)


def _spec(label: str, run) -> AlgorithmSpec:
  if "algorithm" not in run:
    raise ValueError(f"config.runs.{label} has no 'algorithm' field; choose one of {sorted(SPECS)}")
  if run.algorithm not in SPECS:
    raise ValueError(
      f"config.runs.{label}.algorithm={run.algorithm!r} is unknown; choose one of {sorted(SPECS)}"
    )
  return SPECS[run.algorithm]


def validate_run(label: str, run) -> None:
  """Named errors for an unknown algorithm or an unknown field of ``config.runs.<label>``."""
  sch = schema(_spec(label, run))
  allowed = sch.allowed + (["adapters"] if run.algorithm in ADAPTER_ALGORITHMS else [])
  if "systems" in run and "systems" not in allowed:
    raise ValueError(f"config.runs.{label}: algorithm {run.algorithm!r} cannot run a 'systems' section "
                     f"(device speeds, availability, round policies); the algorithms that take it: "
                     f"{systems_algorithms()}")
  check_fields(f"config.runs.{label} (algorithm={run.algorithm!r})", list(run.keys()), allowed)


def systems_algorithms() -> list[str]:
  """The algorithms whose runs take a ``systems`` section (their factory takes ``systems``)."""
  return sorted(n for n, spec in SPECS.items() if "systems" in inspect.signature(spec.factory).parameters)


def factory_kwargs(label: str, run, ctx) -> dict[str, Any]:
  """The keyword arguments of run ``label``'s factory (validated, coerced, converted)."""
  spec = _spec(label, run)
  validate_run(label, run)
  ctx = _run_context(label, run, ctx)
  sch = schema(spec)
  params = sch.params
  where = f"config.runs.{label}"
  kw: dict[str, Any] = {}
  supplied = {"model": ctx.model, "data": ctx.data, "local_optimizer": ctx.local_optimizer,
              "schedule": ctx.schedule, "name": run.algorithm, "topology": ctx.topology,
              "label": run.get("label", run.algorithm),
              "local_learning_rate": ctx.config.local.learning_rate}
  for n, v in supplied.items():
    if n in params:
      kw[n] = v
  if "chunk_size" in params:
    kw["chunk_size"] = ctx.chunk_size(run)
  if "compute_dtype" in params:
    dtype = run.get("compute_dtype", ctx.config.get("compute_dtype", None))
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
  run_ctx = None
  for f in sch.fields:
    try:
      fctx = ctx
      if set(f.targets + f.names) & CAPABILITIES:   # the run's tree and cohort, never the config's
        run_ctx = run_ctx or RunContext(ctx, label, run, params)
        fctx = run_ctx
      kw.update(f.convert({n: run[n] for n in f.names if n in run}, fctx))
    except ValueError as e:
      raise ValueError(f"{where} (algorithm={run.algorithm!r}): {e}") from e
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
  (the context's ``for_run``, :func:`fedtree.experiment.runner.run_context`, which returns a run's
  context unchanged)."""
  if run.get("data", None) is None and run.get("model", None) is None:
    return ctx
  try:
    return ctx.for_run(run)
  except ValueError as e:
    raise ValueError(f"config.runs.{label}: {e}") from e


def _tune_slots(kw: dict, ctx) -> int:
  topology = kw.get("topology") or Topology.flat(ctx.data.num_clients)
  return cohort_slots(kw.get("cohort_size"), topology.leaf_counts(topology.depth - 1))


def build_algorithm(label: str, run_cfg, ctx):
  """The :class:`~fedtree.core.algorithm.FederatedAlgorithm` of run ``label`` (its
  ``config.runs.<label>``) on the shared context (with its ``report`` hook where the spec's
  ``wrap`` adds one: B-HFL's table by level, GroupPerFL's fine-tune stage and tables)."""
  spec = _spec(label, run_cfg)
  ctx = _run_context(label, run_cfg, ctx)
  if "adapters" in run_cfg:
    validate_run(label, run_cfg)
    if any(n in run_cfg for n in FINETUNE_FIELDS):
      raise ValueError(f"config.runs.{label}: fine-tuning before evaluation (finetune_*) does not run on "
                       f"adapters; drop one of them")
    return _with_adapters(label, run_cfg, ctx)
  kw = factory_kwargs(label, run_cfg, ctx)
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


def validate_runs(config) -> None:
  """Early, named errors for every run of ``config``: unknown or missing ``algorithm``, and
  fields the algorithm does not know (with a did-you-mean)."""
  for label, run_cfg in config.runs.items():
    validate_run(label, run_cfg)


def _builder(name: str):
  def build(run, ctx):
    return build_algorithm(_run_label(run, ctx), run, ctx)

  build.__name__ = f"build_{name}"
  return build


BUILDERS = {name: _builder(name) for name in SPECS}
"""``BUILDERS[name](run_config, context)``: :func:`build_algorithm` by algorithm name."""


# ------------------------------------------------------------------------ adapters (LoRA)
ADAPTER_ALGORITHMS = ("fedavg", "fedopt", "hierfavg", "fedprox", "ditto", "grouppfl")
"""Algorithms whose run may set ``adapters: {kind: lora, rank, alpha, targets, forward}``: their model
becomes LoRA adapters on a frozen base (:mod:`fedtree.core.lora`)."""
ADAPTER_KINDS = ("lora",)


def adapters_from_config(label: str, run):
  """The :class:`~fedtree.core.lora.LoRA` spec of ``config.runs.<label>.adapters`` (``None``
  without one): ``{kind: "lora", rank: 8, alpha: 16.0, targets: (regex, ...)}``."""
  from fedtree.core import lora

  if "adapters" not in run or run.adapters is None:
    return None
  where = f"config.runs.{label}.adapters"
  cfg = dict(run.adapters)
  check_fields(where, list(cfg), ("kind", "rank", "alpha", "targets", "forward"))
  kind = cfg.pop("kind", "lora")
  if kind not in ADAPTER_KINDS:
    raise ValueError(f"{where}.kind={kind!r}; choose one of {ADAPTER_KINDS}")
  if "targets" in cfg and not isinstance(cfg["targets"], str):
    cfg["targets"] = tuple(cfg["targets"])
  try:
    return lora.lora(**cfg)
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from e


def _with_adapters(label: str, run_cfg, ctx):
  """Run ``label`` with its model as adapters on the frozen base: the run's ``init_params``
  (e.g. a pretrained model), else ``model.init`` of the config's seed (stream ``"base"``)."""
  from fedtree.core import lora
  from fedtree.core.rng import stream

  spec = adapters_from_config(label, run_cfg)
  base = ctx.initial_params(run_cfg, label)
  if base is None:
    base = ctx.model.init(stream(jax.random.key(int(ctx.config.seed)), "base"))
  inner_run = ml_collections.ConfigDict(
    {k: v for k, v in run_cfg.items() if k not in ("adapters", "init_params")})

  def build(model):
    return build_algorithm(label, inner_run, dataclasses.replace(ctx, model=model, init_params=None))

  try:
    targets = lora.lora_targets(spec, base)
  except ValueError as e:
    raise ValueError(f"config.runs.{label}.adapters: {e}") from e
  full = lora.full_rank_kernels(spec, targets)
  if full:
    import sys

    print(f"warning: config.runs.{label}.adapters: rank={spec.rank} exceeds the smaller side of {full}: "
          f"their adapters hold more parameters than the kernels and are no low-rank update (lower the rank, "
          f"or targets that leave them out)", file=sys.stderr, flush=True)
  return lora.frozen_base(build, model=ctx.model, spec=spec, base=base)
