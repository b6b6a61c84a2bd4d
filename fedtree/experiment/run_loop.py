"""The run loop: one algorithm's rounds (:func:`fedtree.core.loop.run`) with periodic evaluation,
metric rows, byte counts, checkpoints and exact resume, for a single run or a sweep's stacked
experiments alike (:func:`run_algorithm`)."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from fedtree.core import loop
from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.data import FederatedData
from fedtree.core.metrics import FAIRNESS_STATS
from fedtree.core.sharding import local_copy
from fedtree.core.sweep import by_experiment
from fedtree.experiment.fields import field
from fedtree.experiment.llm import budget_summary
from fedtree.experiment.reporting import Reporter
from fedtree.experiment.results import SUMMARY_METRICS, RunStopped, check_summaries, kept_on_stop
from fedtree.experiment.run import Run
from fedtree.toolbox.traffic import Traffic


class Experiment(NamedTuple):
  """One experiment of a sweep as the runner reports it.

  Attributes:
    name: names it in errors (``"experiment 2 (setting lr=0.1, seed 0)"``).
    row: fields added to each of its ``metrics.jsonl`` rows (``setting``, ``seed``, ``experiment``).
    tensorboard_run: its TensorBoard run (one curve per experiment).
    round_metrics: ``r -> {name: number}`` added to its rows (its setting's ε after ``r`` rounds).
  """

  name: str
  row: dict[str, Any]
  tensorboard_run: str
  round_metrics: Callable[[int], dict[str, Any]] | None = None


class Start(NamedTuple):
  """Where a sweep's experiments go on from (successive halving's next stretch, after the stopped
  ones were taken out: :func:`fedtree.core.sweep.compact`).

  Attributes:
    state: their state at the round reached.
    summaries: per experiment (in ``state``'s order), its models' final summaries of the stretch
      before: the bytes, client updates, rounds to the target and ``trained`` go on from there.
  """

  state: Any
  summaries: list[dict[str, dict[str, Any]]]


def run_algorithm(
  run: Run, key: jax.Array, reporter: Reporter, *, eval_every: int, rounds_per_call: int,
  checkpoint_dir: str | None = None, checkpoint_every: int = 0, keep_checkpoints: int = 2,
  should_stop=None, experiments: list[Experiment] | None = None,
  max_abs: float | None = loop.DIVERGENCE_BOUND, target_accuracy: float | None = None,
  start: Start | None = None,
) -> tuple[Any, dict[str, dict[str, Any]]]:
  """``run.rounds`` rounds of ``run.algorithm`` (a :class:`~fedtree.experiment.run.Run`) with
  evaluation every ``eval_every`` rounds (:func:`fedtree.core.loop.run`); returns (state, final
  summaries), the summaries passed through ``algorithm.report`` when the algorithm has one (its
  text printed, its files written into the workdir). The run's models are scored as
  ``run.scoring`` says, its capabilities' per-round metrics (``run.round_metrics``, the privacy
  spent) added to every row and final summary, and the bytes on every edge counted from its
  rounds' metrics (one model: ``run.message_bytes``).

  With ``checkpoint_dir`` and ``checkpoint_every > 0`` the state is saved every
  ``checkpoint_every`` rounds and at the end (the last ``keep_checkpoints`` kept), and a run
  resumes the newest checkpoint there that restores and whose state is within ``max_abs`` (the
  divergence bound, :func:`fedtree.core.loop.run`: a diverged state is never saved, nor resumed).
  ``should_stop()`` is polled after every compiled call; when it returns ``True`` the state
  reached is checkpointed and the run raises :class:`RunStopped` saying what is kept.
  ``target_accuracy``: every model's summary gets ``rounds_to_target``, the first evaluation round
  whose accuracy reached it (``None``: never; a resumed run reads the rounds before from its rows),
  and with a simulated clock (a systems model) ``hours_to_target``, the simulated hours then.

  With ``experiments``, ``run.algorithm`` is a sweep (:func:`fedtree.core.sweep.sweep`) of those
  experiments: every experiment's models are checked and logged as a row of its own (with
  its ``row`` fields, under its TensorBoard run, its own ``round_metrics``), divergence errors
  name the experiment, the summaries are keyed ``"<model>@<e>"``
  (:func:`fedtree.core.sweep.by_experiment` splits them) and no ``report`` is made. ``start``: the
  sweep's experiments go on from a state reached before (:class:`Start`), not from ``init``.
  """
  if eval_every < 1:
    raise ValueError(f"eval_every={eval_every} must be >= 1")
  if rounds_per_call < 1:
    raise ValueError(f"rounds_per_call={rounds_per_call} must be >= 1")
  algorithm, ctx, num_rounds, label = run.algorithm, run.context, run.rounds, run.label
  if ctx.streamed:
    from fedtree.experiment.population import run_streamed

    if experiments is not None:
      raise ValueError(f"{label}: a sweep over a streamed population is not supported (every setting would "
                       f"page its own clients' state); run the settings one by one, or hold the population "
                       f"resident (config.population.mode='resident')")
    hooks = _Hooks(run, reporter, None, target_accuracy)
    return run_streamed(run, key, reporter, hooks, eval_every=eval_every, rounds_per_call=rounds_per_call,
                        checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                        keep_checkpoints=keep_checkpoints, should_stop=should_stop, max_abs=max_abs)
  if ctx.population is not None:   # a population from a store, held resident (it fits)
    reporter.print(f"{label}: {ctx.population.note}")
  state = algorithm.init(loop.init_key(key)) if start is None else start.state
  initial = model_fingerprints(algorithm.models(state))
  ckpt = None
  if checkpoint_dir and checkpoint_every:
    from fedtree.experiment.checkpoint import Checkpointer

    ckpt = Checkpointer(checkpoint_dir, every=checkpoint_every, keep=keep_checkpoints)
    restored = ckpt.restore(state, warn=reporter.print, check=lambda s: loop.diverged_part(s, max_abs))
    if restored is not None:
      state = restored
      reporter.print(f"{label}: resumed from the checkpoint of round {int(state.round)} in {checkpoint_dir}")
  hooks = _Hooks(run, reporter, experiments, target_accuracy)

  def save(s, r):
    ckpt.maybe_save(s, force=r == num_rounds)

  reporter.start_run(label, num_rounds, from_round=int(state.round))
  reporter.write_files(dict(run.files))
  if start is not None and state is start.state:   # goes on: the counts of the stretch before
    hooks.carry(start.summaries)
  elif int(state.round):   # resumed: the bytes of the rounds before, and the rounds at the target
    hooks.resume(state)
  try:
    state = loop.run(
      algorithm, ctx.run_data, num_rounds=num_rounds, key=key, rounds_per_call=rounds_per_call,
      state=state, eval_every=eval_every, on_eval=hooks.evaluate, on_metrics=hooks.log,
      on_rounds=hooks.count,
      on_call=save if ckpt is not None else None, should_stop=should_stop, label=label,
      name_row=hooks.name_row if experiments is not None else None,
      max_abs=max_abs,
    )
    if int(state.round) < num_rounds:
      raise RunStopped(f"{'run' if experiments is None else 'sweep'} {label!r} stopped at round "
                       f"{int(state.round)} of {num_rounds}"
                       f"{kept_on_stop(ckpt, state)}")
  finally:
    if ckpt is not None:
      ckpt.close()
    reporter.end_run(label)
  if not hooks.summaries:  # resumed a finished run: evaluate once
    hooks.evaluate(state, int(state.round))
  summaries = hooks.summaries
  if algorithm.report is not None and experiments is None:
    # a report reads its state and data on the host: this process's copies (gathered when the
    # state spans processes)
    rep = algorithm.report(local_copy(state), ctx.data, key, summaries)
    if rep.text:
      reporter.result(rep.text)
    reporter.write_files(rep.files)
    summaries = rep.summaries
  final = model_fingerprints(algorithm.models(state))
  before = {} if start is None else {f"{m}@{e}": sm.get("trained", False)
                                     for e, sms in enumerate(start.summaries) for m, sm in sms.items()}
  for name, s in summaries.items():  # a model still at its initial parameters is not a result
    if name in initial and name in final:
      s["trained"] = bool(final[name] != initial[name]) or bool(before.get(name, False))
  return state, hooks.final(summaries, int(state.round))


class _Hooks:
  """The host side of one run's loop (:func:`run_algorithm`): its evaluations (checked, logged as
  rows, the first round every model reached the target accuracy), the bytes on every edge (per
  experiment of a sweep) and its ``metrics.jsonl`` rows.

  Args:
    run: the run.
    reporter: where its rows go.
    experiments: a sweep's experiments, or ``None``.
    target: the target accuracy, or ``None``.
  """

  def __init__(self, run: Run, reporter: Reporter, experiments: list[Experiment] | None,
               target: float | None):
    self.run, self.reporter, self.experiments, self.target = run, reporter, experiments, target
    self.summaries: dict[str, dict[str, Any]] = {}   # the last evaluation's
    self.reached: dict[str, int] = {}   # model (``<model>@<e>`` in a sweep) -> first round at the target
    self.reached_hours: dict[str, float] = {}   # and the simulated hours then (a run with a systems clock)
    self.clocked = False   # the state has a simulated clock (systems): summaries report hours_to_target
    self.t0 = time.perf_counter()
    # bytes on every edge, per experiment of a sweep (each its own compressor settings)
    self.traffics = [Traffic(run.message_bytes) for _ in (experiments or [None])]

  def evaluate(self, s, r) -> dict[str, Any]:
    """Every model of state ``s`` scored after round ``r``, checked; its row's metrics."""
    run, experiments = self.run, self.experiments
    self.summaries = summaries = run.scoring.evaluate(run.algorithm, s, run.context, int(r))
    if self.target is not None:
      clocked = self._clock(s)   # simulated seconds (systems)
      for name, sm in summaries.items():
        if name not in self.reached and sm.get("accuracy", -math.inf) >= self.target:
          self.reached[name] = int(r)
          if clocked:
            self.reached_hours[name] = float(s.clock) / 3600.0
    if experiments is None:
      check_summaries(run.label, r, summaries)
      return _flat(summaries)
    row = {}
    for e, (exp, sm) in enumerate(zip(experiments, by_experiment(summaries, len(experiments)), strict=True)):
      check_summaries(f"{run.label}[{exp.name}]", r, sm)
      row.update(_flat(sm, f"@{e}"))
    return row

  def count(self, first_round, metrics) -> None:
    """The bytes of the rounds from ``first_round`` on, from their ``metrics``."""
    if self.experiments is None:
      self.traffics[0].add_rounds(first_round, metrics)
      return
    for t, m in zip(self.traffics, by_experiment(metrics, len(self.experiments)), strict=True):
      t.add_rounds(first_round, m)

  def log(self, r, host) -> None:
    """Round ``r``'s row (``host``: its metrics), with the run's per-round metrics and bytes; a
    sweep's: a row per experiment."""
    host = {**host, "elapsed_s": time.perf_counter() - self.t0}
    label, experiments, round_metrics = self.run.label, self.experiments, self.run.round_metrics
    if experiments is None:
      extra = round_metrics(r) if round_metrics is not None else {}
      self.reporter.log(label, r, {**host, **extra, **self.traffics[0].row()})
      return
    for exp, t, row in zip(experiments, self.traffics, by_experiment(host, len(experiments)), strict=True):
      extra = exp.round_metrics(r) if exp.round_metrics is not None else {}
      self.reporter.log(label, r, {**row, "elapsed_s": host["elapsed_s"], **extra, **t.row(),
                                   "client_updates": t.updates, **exp.row},
                        tensorboard_run=exp.tensorboard_run)

  def name_row(self, e) -> str:
    """The experiment of row ``e`` (rows past the experiments pad the last chunk of a sweep: they
    repeat its last)."""
    return self.experiments[min(e, len(self.experiments) - 1)].name

  def _clock(self, state) -> bool:
    clock = getattr(state, "clock", ())
    self.clocked = self.clocked or (hasattr(clock, "shape") and clock.shape == ())
    return self.clocked

  def carry(self, summaries: list[dict[str, dict[str, Any]]]) -> None:
    """A sweep's experiments go on from ``summaries`` (:class:`Start`): the bytes and client updates
    counted so far, and the rounds at which their models reached the target."""
    for e, (t, sms) in enumerate(zip(self.traffics, summaries, strict=True)):
      first = next(iter(sms.values()), {})
      t.restore(first)
      for model, sm in sms.items():
        if sm.get("rounds_to_target") is not None:
          self.reached[f"{model}@{e}"] = int(sm["rounds_to_target"])
        if sm.get("hours_to_target") is not None:
          self.clocked = True
          self.reached_hours[f"{model}@{e}"] = float(sm["hours_to_target"])

  def resume(self, state) -> None:
    """A run resumed at ``state``'s round: the bytes of the rounds before and the rounds at which
    its models reached the target, from the rows written before."""
    label, experiments, reporter = self.run.label, self.experiments, self.reporter
    for e, t in enumerate(self.traffics):
      row = reporter.row(label, int(state.round),
                         None if experiments is None else {"experiment": experiments[e].row["experiment"]})
      if row is not None:
        t.restore(row)
    if self.target is None:
      return
    for name in self.run.algorithm.models(state):
      model, _, e = name.rpartition("@")
      exp = None
      if experiments is not None and e.isdigit():
        exp = experiments[min(int(e), len(experiments) - 1)]
      match = None if exp is None else {"experiment": exp.row["experiment"]}
      first = reporter.first_round(label, f"{model if exp else name}/accuracy", self.target,
                                   int(state.round), match)
      if first is not None:
        self.reached[name] = first
        seconds = (reporter.row(label, first, match) or {}).get("sim_seconds")
        if self._clock(state) and isinstance(seconds, (int, float)):
          self.reached_hours[name] = float(seconds) / 3600.0

  def final(self, summaries: dict[str, dict[str, Any]], rounds: int) -> dict[str, dict[str, Any]]:
    """The final ``summaries`` after ``rounds`` rounds with the run's per-round metrics, the round
    each model reached the target, and the bytes (a sweep's ``<model>@<e>``: experiment ``e``'s)."""
    round_metrics, target, traffics = self.run.round_metrics, self.target, self.traffics
    if round_metrics is not None:
      summaries = {name: {**s, **round_metrics(rounds)} for name, s in summaries.items()}
    if target is not None:
      hours = self.reached_hours
      summaries = {name: {**s, "target_accuracy": float(target), "rounds_to_target": self.reached.get(name),
                          **({"hours_to_target": hours.get(name)} if self.clocked else {})}
                   if "accuracy" in s else s for name, s in summaries.items()}
    if self.experiments is None and traffics[0].counted:   # every model of the run: the run's traffic
      run, total = self.run, traffics[0].summary()
      budget, warning = budget_summary(run.label, total, field(run.context.config, "communication_budget_MB"))
      if warning:
        self.reporter.result(warning)
      summaries = {name: {**s, **total, **budget} for name, s in summaries.items()}
    elif self.experiments is not None:   # "<model>@<e>": experiment e's traffic (padding rows: none)
      def with_bytes(name: str, s: dict[str, Any]) -> dict[str, Any]:
        _, sep, e = name.rpartition("@")
        ok = sep and e.isdigit() and int(e) < len(traffics) and traffics[int(e)].counted
        return {**s, **traffics[int(e)].summary(), "client_updates": traffics[int(e)].updates} if ok else s

      summaries = {name: with_bytes(name, s) for name, s in summaries.items()}
    return summaries


def _flat(sm: dict[str, dict[str, Any]], suffix: str = "") -> dict[str, Any]:
  """A row's metrics of the models' summaries ``sm``: ``<model>/<metric><suffix>``."""
  return {f"{name}/{m}{suffix}": v for name, s in sm.items() for m, v in round_metrics_of(s).items()}


_TOPK = re.compile(r"(central_)?top\d+_accuracy")


def round_metrics_of(summary: dict[str, Any]) -> dict[str, Any]:
  """What a model's evaluation puts in its ``metrics.jsonl`` row: the :data:`SUMMARY_METRICS` it
  has, and the spread of its per-client metric (``fairness``,
  :func:`fedtree.core.metrics.client_distribution`) as ``<metric>_<stat>``, e.g.
  ``accuracy_p10``, ``accuracy_worst10_mean``, ``accuracy_gini`` (``perplexity_...`` for a
  language model): fairness over rounds, in the rows and TensorBoard; and its top-k accuracies
  (``top5_accuracy``, ``central_top5_accuracy``: ``config.metrics.top_k``)."""
  out = {m: summary[m] for m in SUMMARY_METRICS if m in summary}
  out.update({m: v for m, v in summary.items() if _TOPK.fullmatch(m)})
  fair = summary.get("fairness", None)
  if isinstance(fair, dict) and fair.get("clients"):
    out.update({f"{fair['metric']}_{k}": fair[k] for k in FAIRNESS_STATS if k in fair})
  return out


def model_fingerprints(models: dict[str, Any]) -> dict[str, tuple[float, ...]]:
  """``{name: (sum, sum of squares) of every leaf}`` of ``algorithm.models(state)``: equal
  before and after a run when the model never changed (e.g. the root of a tree whose root
  never aggregated within the run)."""
  out = {}
  for name, params in models.items():
    leaves = [jnp.asarray(x, jnp.float32) for x in jax.tree.leaves(params)]
    out[name] = tuple(float(v) for x in leaves for v in (jnp.sum(x), jnp.sum(x * x)))
  return out


def trace_rounds(algorithm: FederatedAlgorithm, data: FederatedData, key: jax.Array, *,
                 num_rounds: int, config: ml_collections.ConfigDict) -> None:
  """Traces, without compiling or running, the first compiled call :func:`fedtree.core.loop.run`
  makes for ``algorithm`` (the same jitted function, from the loop's cache, so the run does not
  trace it again): whatever a round refuses only while it is traced (a multi-Krum ``f`` too large
  for the cohort, a swept value that must be a constant) is raised here, before the workdir is
  written."""
  n = max(1, min(int(config.rounds_per_call), int(config.eval_every), int(num_rounds) or 1))
  state = jax.eval_shape(algorithm.init, loop.init_key(key))
  step = loop.compile_rounds(algorithm, n, check_state=True, max_abs=divergence_bound(config))
  step.trace(state, data, key)


def target_accuracy(config: ml_collections.ConfigDict) -> float | None:
  """``config.target_accuracy``: the accuracy whose first round every summary reports (``None``: none)."""
  target = field(config, "target_accuracy")
  return None if target is None else float(target)


def divergence_bound(config: ml_collections.ConfigDict) -> float | None:
  """``config.divergence_bound`` (default :data:`fedtree.core.loop.DIVERGENCE_BOUND`; ``None``: no
  bound, finiteness only)."""
  bound = field(config, "divergence_bound")
  return None if bound is None else float(bound)

