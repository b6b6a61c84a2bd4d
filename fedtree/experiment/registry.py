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
  small named converters (:class:`Fields`) from config-only fields;
* every other field is an error naming the run, the field and the allowed fields.

Common run fields, for every algorithm whose factory takes the parameter: ``cohort_size``
(per leaf parent; -1 or absent: all), ``chunk_size`` (an int, ``None``, ``"auto"`` or
``"tune"``; default the config's, else ``"auto"``), ``compute_dtype`` (default the
config's), ``init_params`` (the path of saved parameters to start from, default the config's
``init_params``: :mod:`fedtree.experiment.params`; every algorithm takes it, GroupPerFL in its
first stage), ``weighting``, ``server`` (one server optimizer config ``{name, **hparams}``) /
``servers`` (one per server level), ``periods``, ``tree`` (``"flat"`` or ``"config"``, for
the methods whose tree is optional), ``objective`` (for the algorithms that take a
``client_update``: the local objective, ``{name, **hyperparameters}``, see
:func:`objective_from_config`), and the runner's ``rounds`` and ``label``.

Adding an algorithm: its factory (one file) and one :class:`AlgorithmSpec` line in
:data:`SPECS` (see ``CONTRIBUTING.md``).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

import jax
import ml_collections
import numpy as np
import optax

from fedtree import algorithms, objectives
from fedtree.algorithms.bhfl import proxy_from_clients, with_level_report
from fedtree.algorithms.bhfl.asynchrony import latency_from_config
from fedtree.algorithms.grouppfl.grouppfl import GroupPersonalizedFL
from fedtree.core.topology import Topology
from fedtree.experiment.builders import (
  cohort_slots,
  local_optimizer_from_config,
  resolve_chunk_size,
  server_from_config,
)

RUNNER_FIELDS = ("algorithm", "label", "rounds")
CONTEXT_PARAMS = ("model", "data", "local_optimizer", "schedule", "name")
NOT_CONFIGURABLE = ("client_update", "init_params")
"""Factory parameters that are not run fields of their own name: ``init_params`` is a path
that the context loads (:meth:`fedtree.experiment.runner.Context.initial_params`)."""
TREES = ("flat", "config")
SCALARS = (int, float, bool, str)


@dataclasses.dataclass(frozen=True)
class Fields:
  """A named converter: config-only ``names`` -> factory keyword arguments.

  ``convert(values, ctx)`` gets ``{name: value}`` for the names the run sets (possibly none:
  it is always called, so it can supply a context-dependent default) and returns the keyword
  arguments it sets.
  """

  names: tuple[str, ...]
  convert: Callable[[dict[str, Any], Any], dict[str, Any]]
  targets: tuple[str, ...] = ()  # factory parameters it sets that are not run fields themselves


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """How a run with ``algorithm=<name>`` becomes an algorithm.

  Attributes:
    factory: the algorithm's factory (its signature is the schema).
    fields: converters of the config-only fields.
    defaults: ``defaults(ctx) -> kwargs`` for parameters whose default comes from the config
      (e.g. a rate that defaults to ``config.local.learning_rate``).
    wrap: ``wrap(built, label, run, ctx)``, what the runner gets (B-HFL's report hook,
      GroupPerFL's stages).
  """

  factory: Callable[..., Any]
  fields: tuple[Fields, ...] = ()
  defaults: Callable[[Any], dict[str, Any]] | None = None
  wrap: Callable[..., Any] | None = None


# ------------------------------------------------------------------------ converters
def _number(value):
  """A float field as a float, or unchanged when it is a ``jax.Array`` (a swept value, possibly a
  tracer: its concrete values were checked before tracing)."""
  return value if isinstance(value, jax.Array) else float(value)


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
    local.learning_rate = _number(v[field])
    return {target: local_optimizer_from_config(local)}

  return Fields((field,), convert)


def _per_level_servers(plural: str, single: str, target: str):
  def convert(v, ctx):
    if plural in v:
      return {target: [server_from_config(s) for s in v[plural]]}
    if single in v:
      return {target: server_from_config(v[single])}
    return {}

  return Fields((plural, single), convert)


# B-HFL's converters set only what the run gives; the rest is the factory's default.
def _bhfl_down(v, ctx):
  if "downs" in v or "down" in v:
    return _per_level_servers("downs", "down", "down_optimizers").convert(v, ctx)
  return {"down_optimizers": optax.sgd(_number(v["eta_down"]))} if "eta_down" in v else {}


def _bhfl_periods(v, ctx):
  periods = v.get("periods", None)
  if isinstance(periods, (list, tuple)):
    periods = [tuple(int(q) for q in p) if isinstance(p, (list, tuple)) else int(p) for p in periods]
  elif periods is not None:
    periods = int(periods)
  return {"periods": periods}


def _bhfl_proxy(v, ctx):
  """``proxy_examples`` per node of every level in ``proxy_levels`` (drawn from its subtree's
  clients); ``proxy_steps`` / ``proxy_batch_size`` replace those of the local schedule."""
  out = {}
  if v.get("proxy_examples", None):
    if "proxy_levels" not in v:
      raise ValueError(
        f"proxy_examples={v['proxy_examples']} needs proxy_levels, the server levels whose nodes "
        f"hold proxy data (e.g. (0,): the root)"
      )
    out["proxy"] = {int(lv): proxy_from_clients(ctx.data, ctx.topology, int(lv), int(v["proxy_examples"]),
                                                seed=int(ctx.config.seed) + int(lv))
                    for lv in v["proxy_levels"]}
  if "proxy" in out and "proxy_steps" not in v and isinstance(ctx.schedule.steps, (list, tuple)):
    raise ValueError(
      f"proxy_steps is needed: config.local.steps gives per-client step counts "
      f"({len(ctx.schedule.steps)} of them), which the proxy data (one set per node of "
      f"proxy_levels={tuple(v['proxy_levels'])}) cannot inherit; set proxy_steps, an int >= 1")
  if "proxy_steps" in v or "proxy_batch_size" in v:
    sched = ctx.schedule
    if "proxy_steps" in v:
      sched = dataclasses.replace(sched, epochs=None, steps=int(v["proxy_steps"]))
    if "proxy_batch_size" in v:
      sched = dataclasses.replace(sched, batch_size=int(v["proxy_batch_size"]))
    out["proxy_schedule"] = sched
  return out


def _bhfl_latency(v, ctx):
  if "latency" not in v:
    return {}
  lat = v["latency"]
  if isinstance(lat, (list, tuple)):
    return {"latencies": [latency_from_config(x) for x in lat]}
  return {"latencies": latency_from_config(lat)}


def _bhfl_buffers(v, ctx):
  if "buffer_sizes" not in v:
    return {}
  b = v["buffer_sizes"]
  if isinstance(b, (list, tuple)):
    return {"buffer_sizes": [None if x is None else int(x) for x in b]}
  return {"buffer_sizes": None if b is None else int(b)}


def _bhfl_residual(v, ctx):
  out = {}
  if "residual" in v:
    out["residual_optimizer"] = server_from_config(v["residual"])
  if "residual_down_eta" in v:
    out["residual_down_optimizer"] = optax.sgd(v["residual_down_eta"])
  return out


def _bhfl_report(alg, label, run, ctx):
  return with_level_report(alg, ctx.model, ctx.topology, central_test=ctx.central_test,
                           chunk_size=ctx.config.get("eval_chunk_size", None), label=label)


def _grouppfl_stages(spec, label, run, ctx):
  return spec.algorithm(
    model=ctx.model, data=ctx.data, groups=ctx.groups, local_optimizer=ctx.local_optimizer,
    schedule=ctx.schedule, chunk_size=ctx.chunk_size(run),
    eval_chunk_size=ctx.config.get("eval_chunk_size", None), init_params=ctx.initial_params(run, label),
  )


# ``finetune.<field>`` -> GroupPersonalizedFL's ``finetune_<field>`` (its defaults: the paper's).
FINETUNE_FIELDS = {"epochs": "finetune_epochs", "learning_rates": "finetune_rates",
                   "batch_size": "finetune_batch_size", "optimizer": "finetune_optimizer"}


def _grouppfl_finetune(v, ctx):
  ft = v.get("finetune", None) or {}
  check_fields("finetune", list(ft.keys()), FINETUNE_FIELDS)
  return {FINETUNE_FIELDS[k]: ft[k] for k in ft}   # GroupPersonalizedFL validates them


def _grouppfl_servers(v, ctx):
  return {f: server_from_config(v[f]) for f in ("global_server", "group_server") if f in v}


def _local_rate(ctx):
  return {"learning_rate": float(ctx.config.local.learning_rate)}


# ------------------------------------------------------------------------ the registry
_BHFL_FIELDS = (
  _per_level_servers("ups", "up", "up_optimizers"),
  Fields(("downs", "down", "eta_down"), _bhfl_down),
  Fields(("periods",), _bhfl_periods),
  Fields(("proxy_examples", "proxy_levels", "proxy_steps", "proxy_batch_size"), _bhfl_proxy),
  Fields(("latency",), _bhfl_latency),
  Fields(("buffer_sizes",), _bhfl_buffers),
  Fields(("residual", "residual_down_eta"), _bhfl_residual),
)

SPECS: Mapping[str, AlgorithmSpec] = {
  "fedavg": AlgorithmSpec(algorithms.fedavg),
  "fedopt": AlgorithmSpec(algorithms.fedavg),
  "hierfavg": AlgorithmSpec(algorithms.hierfavg),
  "fedprox": AlgorithmSpec(algorithms.fedprox),
  "fedmmd": AlgorithmSpec(algorithms.fedmmd),
  "ditto": AlgorithmSpec(algorithms.ditto,
                         fields=(_rate_optimizer("personal_learning_rate", "personal_optimizer"),)),
  "pfedme": AlgorithmSpec(algorithms.pfedme, defaults=_local_rate),
  "perfedavg": AlgorithmSpec(algorithms.perfedavg),
  "pfedmt": AlgorithmSpec(algorithms.pfedmt, defaults=_local_rate),
  "bhfl": AlgorithmSpec(algorithms.bhfl, fields=_BHFL_FIELDS, wrap=_bhfl_report),
  "cfl": AlgorithmSpec(algorithms.cfl),
  "ifca": AlgorithmSpec(algorithms.ifca),
  "awcfl": AlgorithmSpec(algorithms.awcfl),
  "mcfl": AlgorithmSpec(algorithms.mcfl),
  "fedkws": AlgorithmSpec(algorithms.fedkws,
                          fields=(_rate_optimizer("private_learning_rate", "private_optimizer"),)),
  "grouppfl": AlgorithmSpec(
    GroupPersonalizedFL,
    fields=(Fields(("finetune",), _grouppfl_finetune, ("finetune_schedule", *FINETUNE_FIELDS.values())),
            Fields(("global_server", "group_server"), _grouppfl_servers)),
    defaults=lambda ctx: {"global_rounds": int(ctx.config.rounds), "group_names": ctx.group_names},
    wrap=_grouppfl_stages,
  ),
}


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


def check_fields(what: str, given, allowed) -> None:
  """``ValueError`` for the first of ``given`` not in ``allowed``, with a did-you-mean."""
  allowed = sorted(set(allowed))
  for field in given:
    if field not in allowed:
      close = difflib.get_close_matches(field, allowed, n=1)
      hint = f" (did you mean {close[0]!r}?)" if close else ""
      raise ValueError(f"{what}: unknown field {field!r}{hint}; allowed fields: {allowed}")


@dataclasses.dataclass(frozen=True)
class Schema:
  """The run fields of one algorithm: scalar parameters (name -> hint), converters, and the
  parameters the context or a converter supplies."""

  params: Mapping[str, inspect.Parameter]
  scalars: Mapping[str, Any]
  fields: tuple[Fields, ...]

  @property
  def allowed(self) -> list[str]:
    names = set(RUNNER_FIELDS) | {"chunk_size", "init_params"} | set(self.scalars)
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
  check_fields(f"config.runs.{label} (algorithm={run.algorithm!r})", list(run.keys()), sch.allowed)


def factory_kwargs(label: str, run, ctx) -> dict[str, Any]:
  """The keyword arguments of run ``label``'s factory (validated, coerced, converted)."""
  spec = _spec(label, run)
  validate_run(label, run)
  sch = schema(spec)
  params = sch.params
  where = f"config.runs.{label}"
  kw: dict[str, Any] = {}
  supplied = {"model": ctx.model, "data": ctx.data, "local_optimizer": ctx.local_optimizer,
              "schedule": ctx.schedule, "name": run.algorithm, "topology": ctx.topology,
              "label": run.get("label", run.algorithm)}
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
  for f in sch.fields:
    try:
      kw.update(f.convert({n: run[n] for n in f.names if n in run}, ctx))
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


def _tune_slots(kw: dict, ctx) -> int:
  topology = kw.get("topology") or Topology.flat(ctx.data.num_clients)
  return cohort_slots(kw.get("cohort_size"), topology.leaf_counts(topology.depth - 1))


def build_algorithm(label: str, run_cfg, ctx):
  """The :class:`~fedtree.core.algorithm.FederatedAlgorithm` of run ``label`` (its
  ``config.runs.<label>``) on the shared context (with its ``report`` hook where the spec's
  ``wrap`` adds one: B-HFL's table by level, GroupPerFL's fine-tune stage and tables)."""
  spec = _spec(label, run_cfg)
  kw = factory_kwargs(label, run_cfg, ctx)
  if kw.get("chunk_size") == "tune":
    kw = resolve_chunk_size(kw, _tune_slots(kw, ctx), spec.factory, ctx)
  try:
    built = spec.factory(**kw)
    if spec.wrap is not None:
      built = spec.wrap(built, label, run_cfg, ctx)
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
