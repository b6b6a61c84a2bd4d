"""Experiments as an array axis: ``E`` runs of one algorithm, settings x seeds, as one algorithm.

:func:`sweep` is a combinator beside :func:`fedtree.core.algorithm.sequential`: it takes a
builder of an algorithm from (traced) hyperparameters, the experiments' settings and seeds,
and returns a :class:`~fedtree.core.algorithm.FederatedAlgorithm` over :class:`SweepState`.
Every algorithm is ``FederatedAlgorithm(init, round)`` with explicit keys, so the experiments
are one ``jax.vmap`` over ``(hyperparameters, state, key)`` with the data broadcast; the
algorithm is built *inside* the traced function from traced scalars, so experiment ``e`` is
exactly the run of ``build(its setting)`` with root key ``jax.random.key(seeds[e])`` done alone.

The result is an ordinary algorithm, run by the one round loop :func:`fedtree.core.loop.run`
(evaluation cadence, checkpoints, exact resume, stop requests and divergence checks are those
of a single run; a state leaf's bad row is the experiment). Its ``models(state)`` names every
experiment's model sets ``"<model>@<e>"`` and its round metrics ``"<metric>@<e>"``
(:func:`by_experiment` splits either back), plus the summed ``train_loss`` and
``nonfinite_experiment``, the first experiment whose round was not finite (``-1`` if none).

Nothing here reads a config: the experiment layer turns ``config.sweep`` into settings and a
builder (:mod:`fedtree.experiment.sweep`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fedtree.core.algorithm import UNNAMED, FederatedAlgorithm, NodeModels, RowName, row_names_of
from fedtree.core.loop import init_key

Builder = Callable[[dict], FederatedAlgorithm]
TRACE_ERRORS = (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
                jax.errors.TracerIntegerConversionError)
"""What a builder that needs a concrete value of a swept hyperparameter raises under a trace."""
T = TypeVar("T")


@struct.dataclass
class SweepState:
  """The state of ``E`` experiments of one algorithm.

  Attributes:
    round: ``int32[]`` rounds completed (the same for every experiment).
    inner: the algorithm's state with a leading experiment axis ``[E, ...]`` on every leaf.
    keys: ``uint32[E, 2]`` every experiment's root key (key data of ``jax.random.key(seed)``).
    hparams: ``{name: float[E]}`` every experiment's swept values, in the run's float dtype (float64
      under ``jax_enable_x64``, ``--config.dtype=float64``; else float32).
  """

  round: jax.Array
  inner: Any
  keys: jax.Array
  hparams: dict

  def row_names(self) -> SweepState:
    """Every row is an experiment; the inner state's names say which part of it."""
    return SweepState(round=UNNAMED, inner=row_names_of(self.inner),  # type: ignore[arg-type]
                      keys=EXPERIMENT_ROWS, hparams=EXPERIMENT_ROWS)  # type: ignore[arg-type]


EXPERIMENT_ROWS = RowName("experiment")


def sweep(
  build: Builder, hparams: Mapping[str, Sequence[float]], seeds: Sequence[int], *,
  name: str = "sweep", explain: Callable[[Exception], Exception] | None = None,
  pad_to: int | None = None,
) -> FederatedAlgorithm:
  """``E = len(seeds)`` experiments of ``build`` as one algorithm.

  Args:
    build: ``build(hparams) -> FederatedAlgorithm`` from ``{name: value}``: traced scalars
      inside ``init`` and ``round``, Python floats for ``models``. It must give every setting
      the same state structure and shapes (swept values are traced, never Python constants).
    hparams: ``{name: [E values]}``, every experiment's setting (``{}``: seeds only).
    seeds: ``[E]`` every experiment's seed: experiment ``e`` is the run with root key
      ``jax.random.key(seeds[e])``.
    name: labels reports.
    explain: maps a builder's error under a trace (:data:`TRACE_ERRORS`: it needs a concrete
      value of a swept field) to the error to raise (default: re-raised unchanged).
    pad_to: run this many experiments, the last one repeated (so that every chunk of a long
      list has one shape, hence one compile); ``models`` names the real ones only.

  Returns:
    A :class:`FederatedAlgorithm` over :class:`SweepState`. Its ``init`` ignores its key (each
    experiment starts from ``init(init_key(key(seeds[e])))``), and so does its ``round`` (each
    experiment folds the round into its own key, as :func:`fedtree.core.loop.run` does for a
    single run). ``round`` depends on ``build`` and ``name`` only, so the chunks of a long list
    of experiments (one :func:`sweep` each) share its compiled program. ``rounds`` is ``None``:
    a fixed-length composition (:func:`fedtree.core.algorithm.sequential`) cannot be stacked.

  Raises:
    ValueError: an experiment count of zero, ``hparams`` and ``seeds`` of different lengths, or
      ``pad_to`` below the count.
  """
  seeds = [int(s) for s in seeds]
  if not seeds:
    raise ValueError("sweep needs at least one experiment (seeds=[])")
  host = {p: [float(v) for v in vals] for p, vals in hparams.items()}
  for p, vals in host.items():
    if len(vals) != len(seeds):
      raise ValueError(f"hparams[{p!r}] has {len(vals)} values for {len(seeds)} seeds")
  settings = [{p: host[p][e] for p in host} for e in range(len(seeds))]
  if pad_to is not None:
    if int(pad_to) < len(seeds):
      raise ValueError(f"pad_to={pad_to} is fewer than the {len(seeds)} experiments")
    extra = int(pad_to) - len(seeds)
    seeds = seeds + seeds[-1:] * extra
    host = {p: vals + vals[-1:] * extra for p, vals in host.items()}

  def init(_key) -> SweepState:
    key_data = jnp.stack([jax.random.key_data(jax.random.key(s)) for s in seeds])
    # the run's float dtype: float64 under --config.dtype=float64 (x64), else float32
    hp = {p: jnp.asarray(v, jax.dtypes.canonicalize_dtype(np.float64)) for p, v in host.items()}
    inner = _jitted_init(build, explain)(hp, key_data)
    return SweepState(round=jnp.zeros((), jnp.int32), inner=inner, keys=key_data, hparams=hp)

  concrete: dict[tuple, FederatedAlgorithm] = {}

  def models(st: SweepState) -> dict[str, NodeModels]:
    out = {}
    for e, setting in enumerate(settings):
      k = tuple(sorted(setting.items()))
      if k not in concrete:
        concrete[k] = build(setting)
      for m, nm in concrete[k].models(experiment(st, e)).items():
        out[f"{m}@{e}"] = nm
    return out

  return FederatedAlgorithm(init=init, round=_round(build, explain), models=models, name=name)


@functools.lru_cache(maxsize=16)
def _jitted_init(build: Builder, explain):
  """The jitted, vmapped ``init`` of ``build`` (one compile per builder and shape)."""

  def one(h, kd):
    with _explained(explain):
      return build(h).init(init_key(jax.random.wrap_key_data(kd)))

  return jax.jit(jax.vmap(one))


@functools.lru_cache(maxsize=16)
def _round(build: Builder, explain) -> Callable:
  """The round of every experiment of ``build`` (one function per builder, so that the
  compiled-round cache of :mod:`fedtree.core.loop` shares it between chunks)."""

  def one(hp, state, data, key_data):
    key = jax.random.wrap_key_data(key_data)
    with _explained(explain):
      return build(hp).round(state, data, jax.random.fold_in(key, state.round))

  def round_(st: SweepState, data, _key):
    inner, metrics = jax.vmap(one, in_axes=(0, 0, None, 0))(st.hparams, st.inner, data, st.keys)
    client = metrics.pop("nonfinite_client", None)
    out = {f"{k}@{e}": v[e] for k, v in metrics.items() for e in range(v.shape[0])}
    # Any experiment's non-finite loss or client update stops the sweep, naming the experiment
    # (the loop's name_row maps it to its setting and seed) and the client.
    bad = jnp.zeros(st.keys.shape[0], bool)
    if "train_loss" in metrics:
      out["train_loss"] = jnp.sum(metrics["train_loss"])
      bad = bad | ~jnp.isfinite(metrics["train_loss"])
    if client is not None:
      bad = bad | (client >= 0)
      out["nonfinite_client"] = jnp.where(bad.any(), client[jnp.argmax(bad)], -1)
    out["nonfinite_experiment"] = jnp.where(bad.any(), jnp.argmax(bad), -1).astype(jnp.int32)
    return SweepState(round=st.round + 1, inner=inner, keys=st.keys, hparams=st.hparams), out

  return round_


class _explained:
  """Maps a trace error of a builder through ``explain`` (a context manager)."""

  def __init__(self, explain):
    self.explain = explain

  def __enter__(self):
    return self

  def __exit__(self, kind, err, tb):
    if self.explain is not None and isinstance(err, TRACE_ERRORS):
      raise self.explain(err) from err
    return False


def experiment(st: SweepState, e: int):
  """The state of experiment ``e`` alone (its ``round`` is the sweep's)."""
  return jax.tree.map(lambda x: x[e], st.inner)


def compact(st: SweepState, keep: Sequence[int]) -> SweepState:
  """The experiments ``keep`` (row indices, in the order given) of ``st`` alone: every leaf of
  their state, their keys and settings, at the same round. A stopped experiment's compute is
  reclaimed (successive halving, :mod:`fedtree.experiment.search`); each kept experiment goes on
  with the computation it would have had among the others, its own key folded with the round (to
  float rounding: XLA may order a sum differently for a narrower batch of experiments).

  Raises:
    ValueError: no experiment kept, or an index outside ``[0, E)``.
  """
  rows = np.asarray(list(keep), np.int64)
  num = st.keys.shape[0]
  if rows.size == 0 or rows.min() < 0 or rows.max() >= num:
    raise ValueError(f"compact keeps {list(keep)} of {num} experiments: give at least one index in "
                     f"[0, {num})")
  take = lambda x: x[rows]   # noqa: E731
  return SweepState(round=jnp.array(st.round, copy=True), inner=jax.tree.map(take, st.inner),
                    keys=take(st.keys),
                    hparams={p: take(v) for p, v in st.hparams.items()})


def exploit(st: SweepState, sources: Sequence[int], hparams: Mapping[str, Sequence[float]]) -> SweepState:
  """Population-based training's exploit and explore step (Jaderberg et al. 2017): experiment ``e``
  takes the whole state of experiment ``sources[e]`` (the model, the optimizers' and the
  algorithm's state: every leaf) and the values ``hparams[p][e]``, and keeps its own key, so a copy
  goes on with its own randomness. ``sources[e] == e`` with its values unchanged leaves ``e`` as it
  was. The shapes do not change, so the round's compiled program is reused.

  Raises:
    ValueError: ``sources`` or a value list not of one entry per experiment, an index outside
      ``[0, E)``, or ``hparams`` naming other values than the state's.
  """
  num = st.keys.shape[0]
  rows = np.asarray(list(sources), np.int64)
  if rows.shape != (num,) or rows.min() < 0 or rows.max() >= num:
    raise ValueError(f"exploit takes a source in [0, {num}) for each of the {num} experiments; "
                     f"got {list(sources)}")
  if set(hparams) != set(st.hparams):
    raise ValueError(f"exploit sets {sorted(hparams)}; the experiments' values are {sorted(st.hparams)}")
  values = {}
  for p, vals in hparams.items():
    if len(vals) != num:
      raise ValueError(f"exploit: hparams[{p!r}] has {len(vals)} values for {num} experiments")
    values[p] = jnp.asarray(np.asarray(vals, np.float64), st.hparams[p].dtype)
  # (new buffers throughout: the loop donates the state it is given, and ``st`` stays usable)
  return SweepState(round=jnp.array(st.round, copy=True), inner=jax.tree.map(lambda x: x[rows], st.inner),
                    keys=jnp.array(st.keys, copy=True), hparams=values)


def by_experiment(named: Mapping[str, T], num_experiments: int) -> list[dict[str, T]]:
  """``{"global@0": a, "train_loss@1": b, "train_loss": c}`` -> ``[{"global": a}, {"train_loss": b}]``:
  a sweep's models or metrics per experiment (names without ``@<e>`` are the sweep's own)."""
  out: list[dict[str, T]] = [{} for _ in range(num_experiments)]
  for k, v in named.items():
    base, sep, e = k.rpartition("@")
    if sep and e.isdigit() and int(e) < num_experiments:
      out[int(e)][base] = v
  return out
