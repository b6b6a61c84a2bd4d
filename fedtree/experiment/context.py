"""The context every run of a config shares: its data, tree, model, local training and initial
parameters, read once from the config (:func:`make_context`), and the precision it runs in.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from fedtree.core import tuning
from fedtree.core.data import FederatedData, as_device, check_model_inputs, check_model_outputs
from fedtree.core.local import LocalSchedule
from fedtree.core.model import as_multi_label
from fedtree.core.sharding import shard_data
from fedtree.core.topology import Topology
from fedtree.experiment import memory
from fedtree.experiment.builders import local_optimizer_from_config, schedule_from_config
from fedtree.experiment.fields import DTYPES, field, run_field
from fedtree.experiment.results import evaluation_options
from fedtree.models import Model, build_model


@dataclasses.dataclass(frozen=True)
class Context:
  """Everything a builder needs, shared by all runs of a config.

  Attributes:
    config: the whole config.
    data: device-resident federated data, local to this process: what builders read on the
      host (sizes, validation, proxy sets) and what a run uses without a mesh.
    groups: ``int[C]`` group (level-1 node) of every client, for per-group reports.
    topology: the tree.
    model: the model.
    local_optimizer: the clients' optax optimizer (``config.local``).
    schedule: local epochs/steps and batch size (``config.local``).
    central_test: ``(x, y)`` of a central test set when the data has one, else ``None``.
    auto_chunk: what ``chunk_size="auto"`` means for this model (a
      :func:`fedtree.core.tuning.chunk_policy`; ``None``: the per-backend default).
    init_params: the parameters every run starts from (``config.init_params``, loaded and
      checked by :func:`fedtree.experiment.params.load_params`); ``None``: ``model.init``.
    group_names: the data's name of every group (``None``: unnamed).
    vocab: the token of every id of a text dataset (``None``: not text); ``config.pretrain``
      encodes its pretraining text with it (:mod:`fedtree.experiment.pretrain`).
    sharded_data: ``data`` with its client axis over the run's mesh (``config.mesh_shape``,
      :func:`fedtree.core.sharding.shard_data`), which rounds and evaluation run on; ``None``
      without a mesh. Across processes (``--multihost``) its arrays span devices this process
      cannot read, which is why builders keep reading :attr:`data`.
    mesh: the devices the client axis is sharded over (``config.mesh_shape``), or ``None``.
    data_info: what the data loader said about the data (:mod:`fedtree.experiment.data`).
    run_overrides: ``None`` for the config's context; for a run that sets its own ``data`` or
      ``model`` (:func:`run_context`), the ``(data, model)`` fields it set.
    tasks: ``{name: (task, tokenizer)}`` the language-model benchmarks of ``config.tasks``
      (:func:`fedtree.experiment.llm.load_tasks`), scored on every run's global model.
    population: how the runs read a population from a store (``config.data.name="store"``:
      :class:`fedtree.experiment.population.Population`, resident or streamed), else ``None``.
  """

  config: ml_collections.ConfigDict
  data: FederatedData
  groups: np.ndarray
  topology: Topology
  model: Model
  local_optimizer: optax.GradientTransformation
  schedule: LocalSchedule
  central_test: tuple[np.ndarray, np.ndarray] | None = None
  auto_chunk: tuning.ChunkPolicy | None = None
  init_params: Any = None
  group_names: tuple[str, ...] | None = None
  vocab: tuple[str, ...] | None = None
  sharded_data: FederatedData | None = None
  mesh: Any = None
  data_info: Any = None
  run_overrides: Any = None
  tasks: Any = None
  population: Any = None

  @property
  def streamed(self) -> bool:
    """Whether the runs read their clients' rows from a store round by round."""
    return self.population is not None and self.population.streamed

  def for_run(self, run) -> Context:
    """The context run ``run`` (a ``config.runs.<label>``) builds and is evaluated in
    (:func:`run_context`: its own data and model, when it sets them, on this context's mesh)."""
    return run_context(self, run)

  def on_mesh(self, mesh) -> Context:
    """This context with its client axis over ``mesh`` (a :func:`fedtree.core.sharding.client_mesh`;
    ``None``: unchanged): :attr:`sharded_data` is :attr:`data` sharded over it."""
    if mesh is None:
      return self
    return dataclasses.replace(self, mesh=mesh, sharded_data=shard_data(self.data, mesh))

  def with_data(self, data: FederatedData) -> Context:
    """This context training on ``data`` (a run's own copy of the clients' data, e.g. a data
    attack's poisoned one): on the device, and sharded over :attr:`mesh` when there is one."""
    if data is self.data:
      return self
    data = as_device(data)
    sharded = shard_data(data, self.mesh) if self.mesh is not None else None
    return dataclasses.replace(self, data=data, sharded_data=sharded)

  def with_eval_chunk(self, chunk: int) -> Context:
    """This context evaluating ``chunk`` clients at once (``config.eval_chunk_size``, in a copy of
    the config): what a run chooses when evaluating every client at once does not fit
    (:class:`fedtree.experiment.memory.Budget`)."""
    config = copy.deepcopy(self.config)
    with config.unlocked(), config.ignore_type():
      config.eval_chunk_size = int(chunk)
    return dataclasses.replace(self, config=config)

  @property
  def run_data(self) -> FederatedData:
    """The data rounds and evaluation run on: :attr:`sharded_data`, else :attr:`data`."""
    return self.data if self.sharded_data is None else self.sharded_data

  def initial_params(self, run: ml_collections.ConfigDict | None = None, label: str = "<label>"):
    """The parameters ``run`` (``config.runs.<label>``) starts from: its ``init_params`` path
    when it sets one (loaded and checked against the model), else the config's
    (:attr:`init_params`), else ``None``."""
    path = run.get("init_params", None) if run is not None else None
    if path is None:
      return self.init_params
    from fedtree.experiment.params import load_params

    return load_params(_path(path, f"config.runs.{label}.init_params"), self.model)

  def chunk_size(self, run: ml_collections.ConfigDict | None = None):
    """The chunk size of ``run`` (its ``chunk_size``, else the config's, else ``"auto"``),
    with ``"auto"`` sized for this model."""
    value = number_or_name(run_field(self.config, run, "chunk_size"))
    return self.auto_chunk if value == "auto" and self.auto_chunk is not None else value


def _path(value, where: str) -> str:
  if not isinstance(value, (str, os.PathLike)):
    raise ValueError(f"{where}={value!r}; it must be the path of a .npz file or an orbax directory")
  return os.fspath(value)


def number_or_name(value):
  """A field that takes a number or a name, as the command line gives it: ``"8"`` -> 8,
  ``"None"``/``"none"`` -> ``None``; anything else unchanged."""
  if isinstance(value, str):
    if value.strip().lstrip("+-").isdigit():
      return int(value)
    if value.strip().lower() == "none":
      return None
  return value


def load_data(cfg: ml_collections.ConfigDict) -> tuple[FederatedData, np.ndarray, Any]:
  """``(data, group labels, central test or None)`` from ``config.data``."""
  from fedtree.experiment.data import load

  return load(cfg)


def build_topology(cfg: ml_collections.ConfigDict, groups: np.ndarray, num_clients: int,
                   label_columns: np.ndarray | None = None) -> Topology:
  """``config.topology.kind``: ``groups`` (root -> data groups -> clients), ``flat``,
  ``sizes`` (``config.topology.sizes``, nested), or ``columns`` (the data's ``label_columns``,
  coarsest first: root -> regions -> ... -> clients)."""
  kind = cfg.kind
  if kind == "columns":
    if label_columns is None:
      raise ValueError("config.topology.kind='columns' needs data that name label columns "
                       "(data.name='hf' with tree_columns, or 'arrays' with [L, C] groups); use 'groups'")
    return Topology.from_label_columns(list(label_columns))
  if kind == "groups":
    return Topology.from_labels(groups)
  if kind == "flat":
    return Topology.flat(num_clients)
  if kind == "sizes":
    topo = Topology.from_sizes(_to_nested(cfg.sizes))
    if topo.num_clients != num_clients:
      raise ValueError(
        f"config.topology.sizes describes {topo.num_clients} clients but the data has {num_clients}"
      )
    return topo
  raise ValueError(f"config.topology.kind={kind!r}; choose 'groups', 'flat', 'sizes' or 'columns'")


def _to_nested(v):
  if isinstance(v, (list, tuple)):
    return [_to_nested(x) for x in v]
  return int(v)


def _load_data(config: ml_collections.ConfigDict, data_config):
  """``config.data`` loaded; data that are not prepared are refused naming, beside the command that
  prepares them, the config's variant that runs without them (``config.without_data``)."""
  from fedtree.experiment.data import load_with_info

  try:
    return load_with_info(data_config)
  except (ValueError, FileNotFoundError) as e:
    other = field(config, "without_data")
    if other is None or "not prepared" not in str(e):
      raise
    raise type(e)(f"{e}; or run the same setup without the data files: python -m fedtree.main "
                  f"--config={other}") from e


def make_context(config: ml_collections.ConfigDict, *, data_config=None, model_config=None,
                 loaded=None) -> Context:
  """The context of ``config``: its data (``config.data``, or ``data_config``; ``loaded``: the
  ``(data, groups, central test, info)`` already loaded), tree, model (``config.model``, or
  ``model_config``), local optimizer and schedule, and initial parameters."""
  from fedtree.experiment.data import model_options

  data_config = config.data if data_config is None else data_config
  model_config = config.model if model_config is None else model_config
  if loaded is None:   # a generated population too large is refused before it is generated
    memory.check_planned(config, data_config)
  data, groups, central, info = _load_data(config, data_config) if loaded is None else loaded
  population = None
  if info.store is not None:   # resident when it fits, streamed when it does not (config.population)
    from fedtree.experiment import population as pop

    data, population = pop.plan(config, data, info.store)
    population = population.with_groups(np.asarray(groups))
  topology = build_topology(config.topology, groups, data.num_clients, info.label_columns)
  data.validate(topology).check_values()
  model_cfg = model_options(dict(model_config), info)  # e.g. the char table of embedding="chars"
  name = model_cfg.pop("name")
  model = build_model(name, example_shape=data.example_shape, num_classes=data.num_classes, **model_cfg)
  if info.label_kind == "multi_hot":   # multi-hot labels [K]: K binary scores, the sigmoid cross-entropy
    model = as_multi_label(model)
  if str(field(config, "dtype")) == "float64":
    data, central, model = as_float64(data, central, model)
  check_model_inputs(model, data)
  check_model_outputs(model, data)
  evaluation_options(config, num_classes=data.num_classes, has_central=central is not None,
                     has_local=int(np.asarray(data.n_test).sum()) > 0)
  local_optimizer = local_optimizer_from_config(config.local)
  schedule = schedule_from_config(config.local)
  init_params = None
  if field(config, "init_params") is not None:
    from fedtree.experiment.params import load_params

    init_params = load_params(_path(config.init_params, "config.init_params"), model)
  elif name == "pretrained":   # the checkpoint's weights: where every run starts (a LoRA run: its base)
    init_params = pretrained_params(model_cfg, data.example_shape[0])
  memory.check_data(data, config)   # a population too large is refused here, not killed in the copy
  from fedtree.experiment.llm import load_tasks

  tasks = load_tasks(config)
  return Context(
    config=config, data=as_device(data), groups=np.asarray(groups), topology=topology, model=model,
    local_optimizer=local_optimizer, schedule=schedule, central_test=central,
    auto_chunk=tuning.chunk_policy(model, local_optimizer, data.example_shape, schedule.batch_size),
    init_params=init_params, group_names=info.group_names, vocab=info.vocab, data_info=info, tasks=tasks,
    population=population,
  )


def pretrained_params(model_cfg: dict[str, Any], seq_len: int):
  """The weights of ``config.model``'s checkpoint (``name="pretrained"``, ``checkpoint=DIR``) in its
  ``dtype`` (:func:`fedtree.models.load_pretrained`)."""
  from fedtree.models.pretrained import load_pretrained

  return load_pretrained(model_cfg["checkpoint"], seq_len=seq_len, dtype=model_cfg.get("dtype", "float32"),
                         tokenizer=False).params


RUN_OVERRIDES = ("data", "model")
"""The sections of the config a run may override with its own fields (merged over them)."""


def run_context(ctx: Context, run) -> Context:
  """The context run ``run`` (a ``config.runs.<label>``) trains and is evaluated in: ``ctx``, or,
  when the run sets ``data`` and/or ``model`` (fields merged over ``config.data`` /
  ``config.model``: e.g. ``data: {partition: "shards"}`` for a pathological split, ``model:
  {norm: "batch"}`` for FedBN's BatchNorm), a context with that data (loaded again, its tree from
  ``config.topology``) and that model, on ``ctx``'s mesh. One config can then compare methods on
  several splits of a dataset, or give one method the model it needs. A run's own context is
  returned unchanged (the run is resolved once, :func:`fedtree.experiment.run.resolve`; the
  registry's builders receive its context).

  Raises:
    ValueError: the run's data or model cannot be built (the message says which section).
  """
  given = {k: run.get(k, None) for k in RUN_OVERRIDES}
  given = {k: (v.to_dict() if hasattr(v, "to_dict") else dict(v)) for k, v in given.items() if v is not None}
  if not given or ctx.run_overrides is not None:
    return ctx
  config = ctx.config
  if "data" in given:
    loaded = None
  else:
    from fedtree.experiment.data import DataInfo

    info = ctx.data_info if ctx.data_info is not None else DataInfo()
    loaded = (ctx.data, ctx.groups, ctx.central_test, info)
  data_cfg = ml_collections.ConfigDict({**config.data.to_dict(), **given.get("data", {})})
  model_cfg = {**config.model.to_dict(), **given.get("model", {})}
  in_memory = ctx.init_params is not None and field(config, "init_params") is None   # e.g. pretrained
  if in_memory and "model" in given:
    raise ValueError(f"its own model ({given['model']}) cannot start from the parameters every other run "
                     f"starts from (they are the config's model's, e.g. a pretrained base); drop its model")
  try:
    built = make_context(config, data_config=data_cfg, model_config=model_cfg, loaded=loaded)
  except TypeError as e:   # a field the dataset or the model does not take
    raise ValueError(f"its {' and '.join(sorted(given))} ({given}): {e}") from e
  if in_memory:   # the same model on other data: the same start
    built = dataclasses.replace(built, init_params=ctx.init_params)
  return dataclasses.replace(built, run_overrides=(given.get("data"), given.get("model"))).on_mesh(ctx.mesh)


def as_float64(data: FederatedData, central, model: Model):
  """``config.dtype="float64"``: the data's float features and the model's initial parameters
  in float64 (every state follows: optimizer and client states are built from the parameters).
  Needs JAX's 64-bit mode (:func:`precision`)."""
  if not jax.config.jax_enable_x64:
    raise ValueError("config.dtype='float64' needs JAX's 64-bit mode: run through python -m "
                     "fedtree.main, or call train_and_evaluate, which turn it on")

  def f64(x):
    x = np.asarray(x)
    return x.astype(np.float64) if np.issubdtype(x.dtype, np.floating) else x

  data = data.replace(x_train=f64(data.x_train), x_test=f64(data.x_test))
  if central is not None:
    central = (f64(central[0]), central[1])
  init = model.init

  def cast(p):   # dictionaries keep their (flax creation) order: fedtree.core.model.layer_order reads it
    if hasattr(p, "items"):
      return {k: cast(v) for k, v in p.items()}
    return jax.tree.map(lambda a: a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a, p)

  def init64(key):
    return cast(init(key))

  float_input = np.issubdtype(np.dtype(model.input_dtype), np.floating)
  input_dtype = "float64" if float_input else model.input_dtype
  return data, central, model._replace(init=init64, input_dtype=input_dtype)


def precision(config: ml_collections.ConfigDict):
  """The context a run of ``config`` runs in: JAX's 64-bit mode for ``config.dtype="float64"``
  (nothing for ``"float32"``; ``JAX_ENABLE_X64=1`` alone leaves every state float32)."""
  dtype = str(field(config, "dtype"))
  if dtype not in DTYPES:
    raise ValueError(f"config.dtype={dtype!r}; choose one of {DTYPES}")
  return jax.enable_x64(True) if dtype == "float64" else contextlib.nullcontext()


