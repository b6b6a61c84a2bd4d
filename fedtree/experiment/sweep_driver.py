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
import numpy as np

from fedtree.core import loop
from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.sweep import by_experiment, compact, exploit
from fedtree.core.sweep import sweep as stacked_sweep
from fedtree.experiment import memory
from fedtree.experiment.fields import field
from fedtree.experiment.reporting import Reporter
from fedtree.experiment.results import SUMMARY_METRICS
from fedtree.experiment.run import Run
from fedtree.experiment.run_loop import (
  Experiment,
  Start,
  divergence_bound,
  run_algorithm,
  target_accuracy,
  trace_rounds,
)
from fedtree.experiment.search import PBT, Halving

SWEEP_BYTES = ("uplink_MB", "downlink_MB", "client_updates")
"""The byte totals (:mod:`fedtree.toolbox.traffic`) a sweep's table reports per setting (every edge
of the tree; the per-edge totals are in each experiment's ``metrics.jsonl`` rows), and the client
updates trained and sent: what the setting cost."""


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
    halving: the successive-halving schedule (``config.sweep.rungs``), or ``None``: every
      experiment to the last round.
    pbt: the population-based training schedule (``config.sweep.pbt_interval``), or ``None``.
    brackets: Hyperband's brackets (``config.sweep.hyperband_min_rounds``), each
      ``(Bracket, indices of its settings)``, or ``None``.
    config_label: the run's label in the config where ``run.label`` names one of its parts (a
      Hyperband bracket); ``None``: ``run.label``.
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
  halving: Halving | None = None
  pbt: PBT | None = None
  brackets: list | None = None
  config_label: str | None = None

  def setting_metrics(self, x: int):
    """Experiment ``x``'s setting's per-round metrics (its ε), or ``None``."""
    return None if self.metrics is None else self.metrics[self.exps[x][0]]

  @property
  def chunks(self) -> list[list[int]]:
    """The experiments of every compiled call, ``size`` at a time."""
    n = len(self.exps)
    return [list(range(k, min(k + self.size, n))) for k in range(0, n, self.size)]

  def stacked(self, chunk: list[int], pad: bool = True) -> FederatedAlgorithm:
    """The experiments ``chunk`` as one algorithm (:func:`fedtree.core.sweep.sweep`), padded to
    the chunk size with ``pad`` (so every chunk shares one compiled program)."""
    paths = sorted(self.settings[0])
    return stacked_sweep(self.build, {p: [self.settings[self.exps[x][0]][p] for x in chunk] for p in paths},
                         [self.exps[x][1] for x in chunk], name=f"{self.run.config.algorithm}[sweep]",
                         explain=self.explain, pad_to=self.size if pad else None)


def plan_sweep(run: Run, *, budget: memory.Budget | None = None, trace: bool = True) -> SweepPlan:
  """``run``'s sweep (the settings x seeds of ``config.sweep``) resolved and checked: every
  setting built with Python values (a calibrated field calibrated per setting), a fixed-length
  composition refused, the memory of a chunk checked against ``budget`` and, with ``trace``, the
  first chunk's stacked program traced (:func:`trace_rounds`: what a builder refuses only for a
  traced value, such as a swept top-k fraction). Nothing is compiled or written."""
  from fedtree.experiment import search, sweep
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
  halving = search.halving_of(config.sweep, run.rounds, label)
  if halving is not None and size < len(exps):
    raise ValueError(f"run {label!r}: successive halving (config.sweep.rungs) compares every setting at a "
                     f"rung, so its {len(exps)} experiments train as one program; config.sweep.chunk={size} "
                     f"splits them: set config.sweep.chunk='all'")
  pbt = search.pbt_of(config.sweep, run.rounds, int(config.eval_every), label)
  brackets = None
  bands = search.hyperband_of(config.sweep, run.rounds, label)
  if bands is not None:
    params = sweep.params_of(config.sweep)
    seed = int(sweep.sweep_field(config.sweep, "sample_seed"))
    per = search.bracket_settings(params, sorted(shown[0]), bands, seed)
    offsets = [sum(len(p) for p in per[:k]) for k in range(len(per))]
    brackets = [(b, list(range(f, f + len(p)))) for b, p, f in zip(bands, per, offsets, strict=True)]
    if metrics is not None or settings != shown:
      raise ValueError(f"run {label!r}: Hyperband draws its settings per bracket, but this run's "
                       f"capabilities read the swept values on the host (a privacy budget's accounting or a "
                       f"calibrated noise multiplier); tune it with a grid or successive halving")
  if pbt is not None and size < len(exps):
    raise ValueError(f"run {label!r}: population-based training ranks every experiment at an exploit step, "
                     f"so its {len(exps)} experiments train as one program; config.sweep.chunk={size} splits "
                     f"them: set config.sweep.chunk='all'")
  if pbt is not None and not settings[0]:
    raise ValueError(f"run {label!r}: population-based training explores swept values, and "
                     f"config.sweep.params sweeps none of this run's")
  if pbt is not None and (metrics is not None or settings != shown):
    raise ValueError(f"run {label!r}: population-based training changes a setting mid-run, but this run's "
                     f"capabilities read its swept values on the host (a privacy budget's accounting or a "
                     f"calibrated noise multiplier), which would then be wrong; tune it with a grid, random "
                     f"search or successive halving")
  note = ""
  if budget is not None:  # the stacked state and working set of a chunk of experiments, before compiling
    shapes = jax.eval_shape(first.init, loop.init_key(jax.random.key(seed0)))
    note = budget.check(label, shapes, ctx.chunk_size(run_cfg), experiments=size,
                        chunk_name="sweep.chunk" if size > 1 else "chunk_size", needs=run.needs)
  plan = SweepPlan(run=run, shown=shown, settings=settings, notes=notes, exps=exps, build=build,
                   explain=sweep.explain(label, algo_name, sorted(settings[0])), metrics=metrics,
                   size=size, note=note, halving=halving, pbt=pbt, brackets=brackets)
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
  run = plan.run
  label, config = run.label, run.context.config
  for line in plan.notes:
    reporter.print(line)
  if plan.note:
    reporter.print(plan.note)
  if plan.halving is not None:
    return _run_halving(plan, reporter, should_stop=should_stop, workdir=workdir)
  if plan.pbt is not None:
    return _run_pbt(plan, reporter, should_stop=should_stop, workdir=workdir)
  if plan.brackets is not None:
    return _run_hyperband(plan, reporter, should_stop=should_stop, workdir=workdir)
  every = int(field(config, "checkpoint_every") or 0)
  chunks = plan.chunks
  finals: dict[int, dict[str, float]] = {}
  untrained: set[str] = set()
  for k, chunk in enumerate(chunks):
    name = label if len(chunks) == 1 else f"{label}#chunk{k}"
    ckpt = os.path.join(workdir, "checkpoints", name) if workdir and every else None
    summaries = _train(plan, reporter, chunk, name, rounds=run.rounds, should_stop=should_stop,
                       checkpoint_dir=ckpt)[1]
    for x, sm in zip(chunk, by_experiment(summaries, len(chunk)), strict=True):
      untrained.update(m for m, v in sm.items() if v.get("trained") is False)   # not a result
      finals[x] = _final(sm, plan.setting_metrics(x), run.rounds)
  names = [label] if len(chunks) == 1 else [f"{label}#chunk{k}" for k in range(len(chunks))]
  return _results(plan, reporter, finals, untrained, names)


def _train(plan: SweepPlan, reporter: Reporter, chunk: list[int], name: str, *, rounds: int, should_stop,
           checkpoint_dir: str | None = None, start: Start | None = None, values: list[dict] | None = None):
  """The experiments ``chunk`` trained to round ``rounds`` as one stacked program under the run name
  ``name`` (:func:`run_algorithm`); ``start``: where they go on from; ``values``: each one's
  setting now, where it is no longer its own (population-based training: the values it explores).
  Returns (state, summaries)."""
  from fedtree.experiment import sweep

  run, exps = plan.run, plan.exps
  config = run.context.config
  shown = [plan.shown[exps[x][0]] for x in chunk] if values is None else values
  experiments = [Experiment(
    name=f"experiment {x} (setting {sweep.setting_name(s)}, seed {exps[x][1]})",
    row={"setting": s, "seed": exps[x][1], "experiment": x},
    tensorboard_run=f"{run.label}/" + (sweep.setting_name(s) if values is None else f"experiment{x}")
                    + f"/seed{exps[x][1]}",
    round_metrics=plan.setting_metrics(x),
  ) for x, s in zip(chunk, shown, strict=True)]
  algorithm = _stacked(plan, chunk, values, pad=start is None)
  return run_algorithm(
    dataclasses.replace(run, label=name, algorithm=algorithm, rounds=int(rounds), round_metrics=None),
    jax.random.key(int(config.seed)), reporter, eval_every=int(config.eval_every),
    rounds_per_call=int(config.rounds_per_call), checkpoint_dir=checkpoint_dir,
    checkpoint_every=int(field(config, "checkpoint_every") or 0) if checkpoint_dir else 0,
    keep_checkpoints=int(field(config, "keep_checkpoints")),
    should_stop=should_stop, experiments=experiments, max_abs=divergence_bound(config),
    target_accuracy=target_accuracy(config), start=start,
  )


def _stacked(plan: SweepPlan, chunk: list[int], values: list[dict] | None, *,
             pad: bool) -> FederatedAlgorithm:
  """The experiments ``chunk`` as one algorithm, with ``values`` in place of their settings (PBT)."""
  if values is None:
    return plan.stacked(chunk, pad=pad)
  return stacked_sweep(plan.build, {p: [v[p] for v in values] for p in sorted(values[0])},
                       [plan.exps[x][1] for x in chunk], name=f"{plan.run.config.algorithm}[sweep]",
                       explain=plan.explain)


CARRIED = ("trained", "rounds_to_target", "hours_to_target", "client_updates")
"""What of an experiment's summaries goes on into its next stretch (:class:`Start`), beside its byte
totals (the ``*_MB`` fields): the same whether the study went on in memory or from its checkpoint."""


def _carried(summaries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
  def plain(v):
    return v if v is None or isinstance(v, (bool, str)) else float(v)

  return {m: {k: plain(v) for k, v in s.items() if k in CARRIED or k.endswith("_MB")}
          for m, s in summaries.items()}


class _Study:
  """Where a halving or PBT study keeps its boundaries (``<workdir>/checkpoints/<run>#at<round>``: the
  compacted or exploited state at a rung or exploit step, and ``<run>#study.json``: what the driver
  knew there) and its stretches' own checkpoints (``<run>#to<round>``), so that a stopped or killed
  study resumes exactly: from its newest boundary, then from its stretch's newest checkpoint. ``None``
  root: no checkpoints (no workdir or ``checkpoint_every=0``)."""

  def __init__(self, plan: SweepPlan, workdir: str | None):
    every = int(field(plan.run.context.config, "checkpoint_every") or 0)
    self.root = os.path.join(workdir, "checkpoints", plan.run.label) if workdir and every else None

  def stretch(self, end: int) -> str | None:
    return None if self.root is None else f"{self.root}#to{end}"

  def load(self) -> dict | None:
    import json

    path = f"{self.root}#study.json" if self.root else None
    if path is None or not os.path.exists(path):
      return None
    with open(path) as f:
      return json.load(f)

  def restore(self, meta: dict, algorithm: FederatedAlgorithm):
    from fedtree.experiment.checkpoint import Checkpointer

    ckpt = Checkpointer(f"{self.root}#at{meta['round']}", every=1, keep=1)
    try:
      state = ckpt.restore(jax.eval_shape(algorithm.init, jax.random.key(0)))
    finally:
      ckpt.close()
    if state is None:
      raise ValueError(f"{self.root}#study.json names the boundary at round {meta['round']}, whose "
                       f"checkpoint is missing; delete {os.path.dirname(self.root)} (or run with "
                       f"--overwrite) to start the study fresh")
    return state

  def save(self, state, meta: dict) -> None:
    """The boundary ``state`` first, then the record naming it (a kill between the two resumes from the
    boundary before)."""
    if self.root is None:
      return
    import json

    from fedtree.experiment.checkpoint import Checkpointer

    ckpt = Checkpointer(f"{self.root}#at{int(state.round)}", every=1, keep=1)
    try:
      ckpt.maybe_save(state, force=True)
    finally:
      ckpt.close()
    tmp = f"{self.root}#study.json.tmp"
    with open(tmp, "w") as f:
      json.dump({**meta, "round": int(state.round)}, f)
    os.replace(tmp, f"{self.root}#study.json")


def _run_halving(plan: SweepPlan, reporter: Reporter, *, should_stop, workdir: str | None = None
                 ) -> dict[str, Any]:
  """Successive halving (:mod:`fedtree.experiment.search`): every experiment trains to the first
  rung; there the settings are scored by the mean of ``config.sweep.select`` over their seeds, the
  best go on (their state compacted, :func:`fedtree.core.sweep.compact`) and the others stop, rung
  after rung, the survivors to the run's last round. Every experiment's final metrics are those of
  the round its setting stopped at."""
  from fedtree.experiment import search, sweep

  run, exps, halving = plan.run, plan.exps, plan.halving
  select = str(sweep.sweep_field(run.context.config.sweep, "select"))
  lower = sweep.lower_is_better(select)
  active = list(range(len(exps)))   # experiments still training, in the state's order
  reached = [0] * len(plan.shown)
  finals: dict[int, dict[str, float]] = {}
  untrained: set[str] = set()
  start, study = None, _Study(plan, workdir)
  meta = study.load()
  if meta is not None:   # resumed at a rung
    active, reached, untrained = meta["active"], meta["reached"], set(meta["untrained"])
    finals = {int(x): v for x, v in meta["finals"].items()}
    start = Start(study.restore(meta, _stacked(plan, active, None, pad=False)), meta["summaries"])
    reporter.print(f"{run.label}: resumed the study at its rung of round {meta['round']} ({len(active)} "
                   f"experiments go on)")
  for end in [e for e in halving.segments(run.rounds) if meta is None or e > meta["round"]]:
    state, summaries = _train(plan, reporter, active, run.label, rounds=end, should_stop=should_stop,
                              start=start, checkpoint_dir=study.stretch(end))
    per_exp = by_experiment(summaries, len(active))
    for x, sm in zip(active, per_exp, strict=True):
      untrained.update(m for m, v in sm.items() if v.get("trained") is False)
      finals[x] = _final(sm, plan.setting_metrics(x), end)
      reached[exps[x][0]] = end
    if end == run.rounds:
      break
    alive = sorted({exps[x][0] for x in active})
    scores = [float(np.mean([finals[x].get(select, np.nan) for x in active if exps[x][0] == i]))
              for i in alive]
    kept = {alive[p] for p in search.survivors(scores, halving.rate, lower_is_better=lower)}
    rows = [p for p, x in enumerate(active) if exps[x][0] in kept]
    best = [p for p in search.ranked(scores, lower_is_better=lower) if alive[p] in kept]
    shown = [f"{sweep.setting_name(plan.shown[alive[p]])}: {scores[p]:.4f}" for p in best][:3]
    reporter.print(f"{run.label}: rung at round {end}: {len(kept)} of {len(alive)} settings go on by "
                   f"{select} (the best: {'; '.join(shown)}{'; ...' if len(kept) > 3 else ''})")
    start = Start(compact(state, rows), [_carried(per_exp[p]) for p in rows])
    active = [active[p] for p in rows]
    study.save(start.state, {"active": active, "reached": reached, "finals": finals,
                             "untrained": sorted(untrained), "summaries": start.summaries})
  spent = sum(finals[x].get("client_updates", 0) for x in finals)
  full = [finals[x].get("client_updates", 0) for x in active]   # the experiments that reached the last round
  if spent and full:
    grid = len(exps) * float(np.mean(full))
    reporter.result(f"successive halving of {run.label!r}: {spent:.0f} client updates in all, "
                    f"{spent / grid:.0%} of the {grid:.0f} that every setting trained to round {run.rounds} "
                    f"would take (at the rate of those that reached it)")
  return _results(plan, reporter, finals, untrained, [run.label], reached)


def _run_hyperband(plan: SweepPlan, reporter: Reporter, *, should_stop,
                   workdir: str | None) -> dict[str, Any]:
  """Hyperband (:func:`fedtree.experiment.search.hyperband`): its brackets one after another, each a
  successive-halving study of its own draws under the run name ``<run>_bracket<s>`` (its table, rows,
  ``tuning_`` and ``best_`` files); then every setting of every bracket in one summary, the best among
  those that reached the last round, and its config as ``best_<run>.py``."""
  from fedtree.experiment import search, sweep

  run = plan.run
  config = run.context.config
  select = str(sweep.sweep_field(config.sweep, "select"))
  rate = float(sweep.sweep_field(config.sweep, "halving_rate"))
  seeds = sorted({seed for _, seed in plan.exps})
  rows, spent = [], 0.0
  for bracket, idx in plan.brackets or []:
    exps = [(j, seed) for j in range(len(idx)) for seed in seeds]
    reporter.print(f"{run.label}: Hyperband bracket {bracket.s}: {len(idx)} settings, rungs "
                   f"{', '.join(map(str, bracket.rungs)) or 'none'}")
    sub = plan._replace(run=dataclasses.replace(run, label=f"{run.label}_bracket{bracket.s}"),
                        shown=[plan.shown[i] for i in idx], settings=[plan.settings[i] for i in idx],
                        exps=exps,
                        size=len(exps), halving=search.Halving(bracket.rungs, rate), brackets=None,
                        config_label=run.label)
    out = _run_halving(sub, reporter, should_stop=should_stop, workdir=workdir)["sweep"]
    for row in out["settings"]:
      rows.append({**row, "bracket": bracket.s, "name": f"[{bracket.s}] {row['name']}"})
      spent += row["mean"].get("client_updates", 0.0) * row["seeds"]
  finished = [r for r in rows if r.get("rounds") == run.rounds]
  best = sweep.best(finished, select)
  out = {"select": select, "settings": rows, "client_updates": spent,
         "brackets": [{"s": b.s, "settings": len(i), "rungs": list(b.rungs)} for b, i in plan.brackets or []],
         "best": None if best is None else {"setting": best["setting"], "name": best["name"],
                                           "mean": best["mean"][select], "std": best["std"][select],
                                           "bracket": best["bracket"]}}
  if best is not None:
    reporter.result(f"Hyperband of {run.label!r}: {len(rows)} settings in {len(plan.brackets or [])} "
                    f"brackets, {spent:.0f} client updates; best by {select}: {best['name']} "
                    f"({best['mean'][select]:.4f})")
    if reporter.workdir:
      sweep.write_best(reporter.workdir, run.label, best, select, config,
                       f"the Hyperband study of run {run.label!r}")
  return {"sweep": out}


def _run_pbt(plan: SweepPlan, reporter: Reporter, *, should_stop,
             workdir: str | None = None) -> dict[str, Any]:
  """Population-based training (:mod:`fedtree.experiment.search`): the experiments train together;
  every ``pbt_interval`` rounds they are ranked by ``config.sweep.select``, the bottom fraction
  copies the whole state of a top one (:func:`fedtree.core.sweep.exploit`: the same shapes, the
  same compiled program) and explores its values; each experiment's lineage (the round, whom it
  copied, its new values) is kept. The table has a row per experiment with its final values."""
  from fedtree.experiment import search, sweep

  run, exps, pbt = plan.run, plan.exps, plan.pbt
  config = run.context.config
  select = str(sweep.sweep_field(config.sweep, "select"))
  lower = sweep.lower_is_better(select)
  params = sweep.params_of(config.sweep)
  rng = np.random.default_rng(int(sweep.sweep_field(config.sweep, "sample_seed") or 0))
  everyone = list(range(len(exps)))
  values = [dict(plan.settings[i]) for i, _ in exps]
  lineage: list[list[dict]] = [[{"round": 0, "from": x, "setting": dict(v)}] for x, v in enumerate(values)]
  finals: dict[int, dict[str, float]] = {}
  untrained: set[str] = set()
  start, study = None, _Study(plan, workdir)
  meta = study.load()
  if meta is not None:   # resumed at an exploit step
    values, lineage, untrained = meta["values"], meta["lineage"], set(meta["untrained"])
    finals = {int(x): v for x, v in meta["finals"].items()}
    rng.bit_generator.state = meta["rng"]
    start = Start(study.restore(meta, _stacked(plan, everyone, values, pad=False)), meta["summaries"])
    reporter.print(f"{run.label}: resumed the study at its exploit step of round {meta['round']}")
  for end in [e for e in pbt.segments(run.rounds) if meta is None or e > meta["round"]]:
    state, summaries = _train(plan, reporter, everyone, run.label, rounds=end, should_stop=should_stop,
                              start=start, values=values, checkpoint_dir=study.stretch(end))
    per_exp = by_experiment(summaries, len(everyone))
    for x, sm in enumerate(per_exp):
      untrained.update(m for m, v in sm.items() if v.get("trained") is False)
      finals[x] = _final(sm, None, end)
    if end == run.rounds:
      break
    scores = [finals[x].get(select, np.nan) for x in everyone]
    sources = search.exploit_sources(scores, pbt.fraction, rng, lower_is_better=lower)
    copied = [x for x in everyone if sources[x] != x]
    for x in copied:
      values[x] = search.explore(values[sources[x]], params, pbt, rng)
      lineage[x].append({"round": end, "from": sources[x], "setting": dict(values[x])})
    steps = "; ".join(f"#{x} <- #{sources[x]}: {sweep.setting_name(values[x])}" for x in copied[:3])
    reporter.print(f"{run.label}: exploit at round {end}: {len(copied)} of {len(everyone)} experiments copy "
                   f"a better one and explore ({steps}{'; ...' if len(copied) > 3 else ''})")
    # (each slot's bytes and client updates go on from its own count: the study's cost is their sum)
    start = Start(exploit(state, sources, {p: [v[p] for v in values] for p in sorted(values[0])}),
                  [_carried(s) for s in per_exp])
    study.save(start.state, {"values": values, "lineage": lineage, "finals": finals,
                             "untrained": sorted(untrained), "summaries": start.summaries,
                             "rng": rng.bit_generator.state})
  out = _results(plan, reporter, finals, untrained, [run.label], members=values)
  out["sweep"]["lineage"] = lineage
  if reporter.workdir:
    import json

    with open(os.path.join(reporter.workdir, f"pbt_{run.label}.json"), "w") as f:
      json.dump({"select": select, "pbt": plan.pbt._asdict(), "lineage": lineage}, f, indent=1)
  return out


def _final(sm: dict[str, dict[str, Any]], metrics, rounds: int) -> dict[str, float]:
  """An experiment's final metrics for the table, from its models' summaries ``sm`` after
  ``rounds`` rounds (``metrics``: its setting's per-round metrics, its ε, or ``None``)."""
  from fedtree.experiment import sweep

  trained = {m: v for m, v in sm.items() if v.get("trained") is not False}
  out = {f"{m}/{s}": v[s] for m, v in trained.items() for s in SUMMARY_METRICS if s in v}
  out.update(sweep.final_extras(trained))
  out.update({k: v for k, v in next(iter(sm.values()), {}).items() if k in SWEEP_BYTES})
  if metrics is not None:   # ε of this setting (host)
    out.update(metrics(rounds))
  return out


def _results(plan: SweepPlan, reporter: Reporter, finals: dict[int, dict[str, float]], untrained: set[str],
             names: list[str], reached: list[int] | None = None,
             members: list[dict] | None = None) -> dict[str, Any]:
  """The table of a sweep's ``finals`` (per experiment), its outputs and ``summary.json`` entry;
  ``names``: the run names its rows were logged under (one per chunk); ``reached``: per setting,
  the round it stopped at (successive halving); ``members``: per experiment, its final setting
  (population-based training: a row per experiment, not per setting)."""
  from fedtree.experiment import sweep

  run, shown, exps = plan.run, plan.shown, plan.exps
  label, config = run.label, run.context.config
  if members is None:
    per_setting = [[finals[x] for x, (i, _) in enumerate(exps) if i == s] for s in range(len(shown))]
    rows = sweep.aggregate(shown, per_setting)
  else:
    rows = sweep.aggregate(members, [[finals[x]] for x in range(len(exps))])
    for x, row in enumerate(rows):
      row["name"] = f"#{x} {row['name']}"
  if reached is not None:
    for row, r in zip(rows, reached, strict=True):
      row["rounds"] = r
  select = str(sweep.sweep_field(config.sweep, "select"))
  reporter.result(sweep.format_table(label, rows))
  if untrained:
    reporter.result(f"(left out, never trained within the run: its parameters are still the initial "
                    f"ones: {', '.join(f'{label} {m}' for m in sorted(untrained))})")
  records = [r for name in names for r in reporter.rows(name)]
  out = sweep.write_outputs(reporter.workdir, label, rows, select, config=config, paths=sorted(shown[0]),
                            records=records, run_label=plan.config_label)  # None off process 0
  out["untrained"] = sorted(untrained)
  if out["best"] is not None:
    spread = f" ± {out['best']['std']:.4f}" if int(sweep.sweep_field(config.sweep, "seeds") or 1) > 1 else ""
    reporter.result(f"best setting of {label!r} by {select}: {out['best']['name']} "
                    f"({out['best']['mean']:.4f}{spread})")
  return {"sweep": out}
