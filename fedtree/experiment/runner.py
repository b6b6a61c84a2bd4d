"""From a config to results: data, tree, model, every run of the config, reports.

``train_and_evaluate(config, workdir)`` is what ``python -m fedtree.main`` calls. A config
names the data, the tree, the model, the local training and one or more *runs*
(``config.runs.<label>``), each an algorithm from :data:`fedtree.algorithms.BUILDERS` with
its hyperparameters; all runs see the same data, tree, initial model and seed, and the
final table compares them.

A builder returns a :class:`~fedtree.core.algorithm.FederatedAlgorithm` (multi-stage
methods such as GroupPerFL are one too, composed by :func:`fedtree.core.algorithm.sequential`),
run here by the one round loop (:mod:`fedtree.experiment.run_loop`) with periodic evaluation,
checkpoints and exact resume; its optional ``report`` hook returns extra tables and files,
which this layer prints (stdout) and writes (workdir). The concerns around it live beside it:
the shared context (:mod:`~fedtree.experiment.context`), the config's checks
(:mod:`~fedtree.experiment.validation`), the workdir (:mod:`~fedtree.experiment.workdir`) and
sweeps (:mod:`~fedtree.experiment.sweep_driver`).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import jax
import ml_collections

from fedtree.core.sharding import agreed, barrier, client_mesh
from fedtree.experiment import memory
from fedtree.experiment.context import Context, as_float64, make_context, precision, run_context  # noqa: F401  (runner.make_context, .run_context, .as_float64)
from fedtree.experiment.fields import field
from fedtree.experiment.reporting import Reporter
from fedtree.experiment.results import RunStopped, positive_classes_from_config  # noqa: F401  (runner.*)
from fedtree.experiment.run import resolve
from fedtree.experiment.run_loop import divergence_bound, run_algorithm, target_accuracy, trace_rounds
from fedtree.experiment.sweep_driver import plan_sweep, run_sweep
from fedtree.experiment.validation import prepare_config, selected_runs, validate_config
from fedtree.experiment.workdir import (  # noqa: F401  (runner.config_fingerprint)
  check_workdir,
  config_fingerprint,
  workdir_listing,
  write_plots,
  write_summary,
  write_workdir,
)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | None, *,
                       overwrite: bool = False, should_stop=None) -> dict[str, Any]:
  """Runs every run of ``config``; writes ``metrics.jsonl`` and ``summary.json`` to ``workdir``.

  A workdir remembers the fingerprint of its config (``fingerprint.json``; fields that do not
  change results, such as ``rounds`` or ``progress``, are left out, so a run can be extended):
  a different config is refused unless ``overwrite``, which clears the workdir's metrics,
  checkpoints and summaries first. ``should_stop`` (polled after every compiled call) stops
  the run cleanly (:class:`RunStopped`). Returns ``{run label: {model name: summary}}``.

  Example:
    One round of FedAvg on 5 synthetic clients (the final table goes to stdout):

    >>> import tempfile
    >>> import ml_collections
    >>> config = ml_collections.ConfigDict(dict(
    ...   seed=0, rounds=1, eval_every=1, rounds_per_call=1, progress=False, plots=False,
    ...   data=dict(name="grouped_synthetic", group_sizes=(3, 2), dim=8, num_classes=3),
    ...   topology=dict(kind="groups"), model=dict(name="logreg"),
    ...   local=dict(optimizer="sgd", learning_rate=0.1, batch_size=8, steps=1),
    ...   runs=dict(fedavg=dict(algorithm="fedavg"))))
    >>> results = train_and_evaluate(config, tempfile.mkdtemp())
    <BLANKLINE>
    Final evaluation ...
    >>> sorted(results["fedavg"])
    ['global']
  """
  config = prepare_config(config)
  validate_config(config)
  with precision(config):
    return _train_and_evaluate(config, workdir, overwrite=overwrite, should_stop=should_stop)


def _train_and_evaluate(config, workdir, *, overwrite, should_stop) -> dict[str, Any]:
  from fedtree.experiment import sweep

  swept = sweep.sweep_config(config) is not None
  # Several processes (--multihost) run this same function: all of them train and check the
  # workdir, process 0 alone writes rows, tables, summary and plots (checkpoints are written
  # by all, each its shards, through orbax).
  primary = jax.process_index() == 0
  should_stop = agreed(should_stop)   # a signal that reached one process stops all at one round
  if workdir:  # a workdir of another config is refused before the data are loaded
    check_workdir(workdir, config, overwrite=overwrite)
  ctx = make_context(config)
  mesh = None
  if field(config, "mesh_shape") is not None:  # the client axis over devices (fedtree.core.sharding)
    mesh = client_mesh(config.mesh_shape)
    ctx = ctx.on_mesh(mesh)
  on_mesh = (lambda: jax.set_mesh(mesh)) if mesh is not None else contextlib.nullcontext
  root = jax.random.key(int(config.seed))
  labels = [label for label, _ in selected_runs(config)]
  # Every run (and every setting of a sweep) is resolved, its memory checked and its first compiled
  # call traced (not compiled) before the first one trains or anything is written: a bad value in
  # the last run, or one a round refuses only while it is traced, is refused up front.
  pretraining = None
  if config.get("pretrain", None) is not None:   # checked and its text read; trained below
    from fedtree.experiment.pretrain import prepare_pretrain

    pretraining = prepare_pretrain(ctx)
  with on_mesh():
    planned, budget = _plan(labels, ctx, root, swept)
  if workdir:
    # every process reads the workdir before process 0 writes it (all refuse alike), and
    # none opens it before process 0 has prepared it
    barrier("fedtree: workdir checked")
    if primary:
      write_workdir(workdir, config, overwrite=overwrite)
    barrier("fedtree: workdir prepared")
  reporter = Reporter(workdir, show_progress=field(config, "progress")) if primary else Reporter.silent()
  if workdir:
    reporter.print(f"fedtree: workdir {os.path.abspath(workdir)}")
  else:
    reporter.print("warning: no workdir given: metrics, checkpoints and the summary are not saved "
                   "(pass --workdir=DIR)")
  results: dict[str, Any] = {}
  if config.get("pretrain", None) is not None:  # a pretrained base, trained now (issue 26)
    from fedtree.experiment.pretrain import pretrain_context

    ctx, results["pretrained"] = pretrain_context(ctx, reporter.print, prepared=pretraining)
    with on_mesh():   # the runs start from the pretrained base: resolved again on it
      planned, budget = _plan(labels, ctx, root, swept, trace=False)
  try:
    for i, label in enumerate(labels):
      plan = planned.pop(label)
      if i:   # what the earlier runs' compiles freed, back to the system before this one compiles
        memory.release_heap()
      with on_mesh():
        if swept:  # settings x seeds of this run as one program (fedtree.experiment.sweep)
          results[label] = run_sweep(plan, reporter, workdir=workdir, should_stop=should_stop)
          continue
        run, note = plan
        if i and budget.process:   # its line again from what the process holds now (earlier runs included)
          note = run.memory(budget, root)
        reporter.print(note)
        _, results[label] = run_algorithm(
          run, root, reporter, eval_every=int(config.eval_every), rounds_per_call=int(config.rounds_per_call),
          checkpoint_dir=os.path.join(workdir, "checkpoints", label) if workdir else None,
          checkpoint_every=int(field(config, "checkpoint_every") or 0),
          keep_checkpoints=int(field(config, "keep_checkpoints")), should_stop=should_stop,
          max_abs=divergence_bound(config), target_accuracy=target_accuracy(config),
        )
    if not swept:
      reporter.summary_table(results, groups=ctx.groups, group_names=ctx.group_names)
    elif config.sweep.get("columns", None):   # one table across the runs (configs/baselines.py)
      reporter.result(sweep.format_runs_table(results, tuple(config.sweep.columns)))
    elif len(results) > 1:   # the runs side by side: every model's mean ± std over seeds
      reporter.result(sweep.runs_table(results))
    if workdir and primary:
      write_summary(workdir, results)
      write_plots(workdir, config, reporter)
    if workdir and primary:
      reporter.result(workdir_listing(workdir))   # (a result: stdout, after the final table)
  finally:
    reporter.close()
  return results


def _plan(labels: list[str], ctx: Context, root: jax.Array, swept: bool, *,
          trace: bool = True, eval_note: str = "") -> tuple[dict[str, Any], memory.Budget]:
  """Every run of ``labels`` resolved (:func:`fedtree.experiment.run.resolve`) and checked: a
  single run's memory line and its first compiled call traced (``trace``), a sweep planned
  (:func:`fedtree.experiment.sweep_driver.plan_sweep`); ``({label: (Run, memory line) | SweepPlan},
  the budget they were checked against)``.
  Where evaluating every client at once does not fit beside some run, every run is planned again
  evaluating the chunk the check chose (:attr:`fedtree.experiment.memory.Budget.chosen_eval_chunk`),
  each line saying so (``eval_note``)."""
  budget = memory.Budget.of(ctx)
  budget.eval_note = eval_note
  out: dict[str, Any] = {}
  for label in labels:
    run_cfg = ctx.config.runs[label]
    settled = budget.chosen_eval_chunk is None   # else planned again below: traced then
    if swept:
      run = resolve(label, run_cfg, ctx, build=False)
      out[label] = plan_sweep(run, budget=budget, trace=trace and settled)
      continue
    run = resolve(label, run_cfg, ctx)
    if run.context.streamed:   # what cannot stream, or scores nothing: refused before anything is written
      from fedtree.experiment.population import check_streamed

      check_streamed(run, root)
    note = run.memory(budget, root)
    if trace and budget.chosen_eval_chunk is None:
      trace_rounds(run.algorithm, run.context.run_data, root, num_rounds=run.rounds, config=ctx.config)
    out[label] = (run, note)
  if budget.chosen_eval_chunk is not None:
    return _plan(labels, ctx.with_eval_chunk(budget.chosen_eval_chunk), root, swept, trace=trace,
                 eval_note=budget.eval_note)
  return out, budget
