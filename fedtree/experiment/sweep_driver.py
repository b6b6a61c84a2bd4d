"""A run's sweep driven like a single run: its settings x seeds resolved and checked before
anything trains (:func:`plan_sweep`), then stacked experiments chunk after chunk through the run
loop (:func:`run_sweep`), and the table of their final metrics. The config's side (settings,
calibration, the table) is :mod:`fedtree.experiment.sweep`'s."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from fedtree.core import loop
from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.sweep import by_experiment
from fedtree.core.sweep import sweep as stacked_sweep
from fedtree.experiment import memory
from fedtree.experiment.fields import field
from fedtree.experiment.reporting import Reporter
from fedtree.experiment.results import SUMMARY_METRICS
from fedtree.experiment.run import Run
from fedtree.experiment.run_loop import (
  Experiment,
  divergence_bound,
  run_algorithm,
  target_accuracy,
  trace_rounds,
)

SWEEP_BYTES = ("uplink_MB", "downlink_MB")
"""The byte totals (:mod:`fedtree.toolbox.traffic`) a sweep's table reports per setting (every edge
of the tree; the per-edge totals are in each experiment's ``metrics.jsonl`` rows)."""


class SweepPlan(NamedTuple):
  """A run's sweep, resolved and checked before anything trains or is written (:func:`plan_sweep`);
  :func:`run_sweep` runs it.

  Attributes:
    run: the run (:class:`~fedtree.experiment.run.Run`, its algorithm built per setting here).
    shown: every setting as the config gives it (rows, names and the table).
    settings: every setting as the builder traces it (a calibrated field's traced value in place of
      the one the config sweeps: a target ε's noise multiplier).
    notes: what the calibration chose, a line each (printed before the sweep runs).
    exps: ``(setting index, seed)`` of every experiment.
    build: the builder of one experiment (:func:`fedtree.experiment.sweep.config_builder`).
    explain: what a builder's trace error becomes (:func:`fedtree.experiment.sweep.explain`).
    metrics: per setting, its capabilities' per-round metrics ``r -> {name: number}`` (its ε after
      ``r`` rounds, on the host), or ``None`` when none reports any.
    size: experiments per compiled call (``config.sweep.chunk``).
    note: the memory line of a chunk (:meth:`fedtree.experiment.memory.Budget.check`), or ``""``.
  """

  run: Run
  shown: list[dict[str, float]]
  settings: list[dict[str, float]]
  notes: list[str]
  exps: list[tuple[int, int]]
  build: Callable
  explain: Callable
  metrics: list | None
  size: int
  note: str

  @property
  def chunks(self) -> list[list[int]]:
    """The experiments of every compiled call, ``size`` at a time."""
    n = len(self.exps)
    return [list(range(k, min(k + self.size, n))) for k in range(0, n, self.size)]

  def stacked(self, chunk: list[int]) -> FederatedAlgorithm:
    """The experiments ``chunk`` as one algorithm (:func:`fedtree.core.sweep.sweep`)."""
    paths = sorted(self.settings[0])
    return stacked_sweep(self.build, {p: [self.settings[self.exps[x][0]][p] for x in chunk] for p in paths},
                         [self.exps[x][1] for x in chunk], name=f"{self.run.config.algorithm}[sweep]",
                         explain=self.explain, pad_to=self.size)


def plan_sweep(run: Run, *, budget: memory.Budget | None = None, trace: bool = True) -> SweepPlan:
  """``run``'s sweep (the settings x seeds of ``config.sweep``) resolved and checked: every
  setting built with Python values (a calibrated field calibrated per setting), a fixed-length
  composition refused, the memory of a chunk checked against ``budget`` and, with ``trace``, the
  first chunk's stacked program traced (:func:`trace_rounds`: what a builder refuses only for a
  traced value, such as a swept top-k fraction). Nothing is compiled or written."""
  from fedtree.experiment import sweep
  from fedtree.experiment.registry import build_algorithm

  label, run_cfg, ctx, rctx = run.label, run.config, run.context, run.run_context
  config = ctx.config
  shown = sweep.settings_of(config, label)   # as given: rows, names and the table
  config, settings = sweep.calibrated(config, label, shown, rctx)   # what the builder traces
  notes = sweep.calibration_notes(run.capabilities, label, shown, settings)
  n_seeds = int(sweep.sweep_field(config.sweep, "seeds") or 1)
  seed0 = int(config.seed)
  exps = [(i, seed0 + j) for i in range(len(settings)) for j in range(n_seeds)]
  build = sweep.config_builder(config, label, rctx, build_algorithm)
  first = build(settings[0])  # Python values: early errors, before anything is traced
  for s in settings[1:]:
    build(s)
  algo_name = str(run_cfg.algorithm)
  if first.rounds is not None:
    raise ValueError(
      f"run {label!r} (algorithm {algo_name!r}) is a fixed-length composition of stages "
      "(fedtree.core.algorithm.sequential); a sweep cannot stack it yet: sweep it as separate runs"
    )
  metrics = sweep.setting_metrics(config, label, settings, rctx)   # ε per setting (host), or None
  size = sweep.chunk_size(config, len(exps), ctx)
  note = ""
  if budget is not None:  # the stacked state and working set of a chunk of experiments, before compiling
    shapes = jax.eval_shape(first.init, loop.init_key(jax.random.key(seed0)))
    note = budget.check(label, shapes, ctx.chunk_size(run_cfg), experiments=size,
                        chunk_name="sweep.chunk" if size > 1 else "chunk_size", needs=run.needs)
  plan = SweepPlan(run=run, shown=shown, settings=settings, notes=notes, exps=exps, build=build,
                   explain=sweep.explain(label, algo_name, sorted(settings[0])), metrics=metrics,
                   size=size, note=note)
  if trace:
    trace_rounds(plan.stacked(plan.chunks[0]), ctx.run_data, jax.random.key(seed0),
                 num_rounds=run.rounds, config=config)
  return plan


def run_sweep(plan: SweepPlan, reporter: Reporter, *, workdir: str | None,
              should_stop=None) -> dict[str, Any]:
  """Every experiment of a planned sweep (:func:`plan_sweep`) as stacked programs
  (:func:`fedtree.core.sweep.sweep`), chunk after chunk (``config.sweep.chunk``, one compile), each
  run by :func:`run_algorithm` like a single run (scored as the run is: a backdoor's success rate
  in every experiment's rows). Logs a ``metrics.jsonl`` row per experiment and evaluation round
  (with ``setting`` and ``seed``), prints the mean ± std table, writes the PNG and returns the
  run's ``summary.json`` entry (rows per setting and the best by ``config.sweep.select``)."""
  from fedtree.experiment import sweep

  run = plan.run
  label, config = run.label, run.context.config
  shown, settings, exps = plan.shown, plan.settings, plan.exps
  for line in plan.notes:
    reporter.print(line)
  if plan.note:
    reporter.print(plan.note)
  seed0 = int(config.seed)
  every = int(field(config, "checkpoint_every") or 0)
  chunks = plan.chunks
  finals: dict[int, dict[str, float]] = {}
  untrained: set[str] = set()
  metrics = plan.metrics
  for k, chunk in enumerate(chunks):
    name = label if len(chunks) == 1 else f"{label}#chunk{k}"
    experiments = [Experiment(
      name=f"experiment {x} (setting {sweep.setting_name(shown[exps[x][0]])}, seed {exps[x][1]})",
      row={"setting": shown[exps[x][0]], "seed": exps[x][1], "experiment": x},
      tensorboard_run=f"{label}/{sweep.setting_name(shown[exps[x][0]])}/seed{exps[x][1]}",
      round_metrics=None if metrics is None else metrics[exps[x][0]],
    ) for x in chunk]
    _, summaries = run_algorithm(
      dataclasses.replace(run, label=name, algorithm=plan.stacked(chunk), round_metrics=None),
      jax.random.key(seed0), reporter, eval_every=int(config.eval_every),
      rounds_per_call=int(config.rounds_per_call),
      checkpoint_dir=os.path.join(workdir, "checkpoints", name) if workdir and every else None,
      checkpoint_every=every, keep_checkpoints=int(field(config, "keep_checkpoints")),
      should_stop=should_stop, experiments=experiments, max_abs=divergence_bound(config),
      target_accuracy=target_accuracy(config),
    )
    for x, sm in zip(chunk, by_experiment(summaries, len(chunk)), strict=True):
      untrained.update(m for m, v in sm.items() if v.get("trained") is False)   # not a result
      finals[x] = {f"{m}/{s}": v[s] for m, v in sm.items() if v.get("trained") is not False
                   for s in SUMMARY_METRICS if s in v}
      finals[x].update(sweep.final_extras({m: v for m, v in sm.items() if v.get("trained") is not False}))
      finals[x].update({k: v for k, v in next(iter(sm.values()), {}).items() if k in SWEEP_BYTES})
      if metrics is not None and metrics[exps[x][0]] is not None:   # ε of this setting (host)
        finals[x].update(metrics[exps[x][0]](run.rounds))
  per_setting = [[finals[x] for x, (i, _) in enumerate(exps) if i == s] for s in range(len(settings))]
  rows = sweep.aggregate(shown, per_setting)
  select = str(sweep.sweep_field(config.sweep, "select"))
  reporter.result(sweep.format_table(label, rows))
  if untrained:
    reporter.result(f"(left out, never trained within the run: its parameters are still the initial "
                    f"ones: {', '.join(f'{label} {m}' for m in sorted(untrained))})")
  out = sweep.write_outputs(reporter.workdir, label, rows, select)  # None off process 0
  out["untrained"] = sorted(untrained)
  if out["best"] is not None:
    spread = f" ± {out['best']['std']:.4f}" if int(sweep.sweep_field(config.sweep, "seeds") or 1) > 1 else ""
    reporter.result(f"best setting of {label!r} by {select}: {out['best']['name']} "
                    f"({out['best']['mean']:.4f}{spread})")
  return {"sweep": out}
