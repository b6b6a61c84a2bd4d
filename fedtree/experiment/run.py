"""A configured run resolved once into a typed :class:`Run`: its algorithm, the data it trains on,
how its models are scored, its capabilities' host hooks and its rounds (:func:`resolve`).

The capabilities of a run (:mod:`fedtree.experiment.capabilities`) act through their hooks here,
each section read once: the data a capability alters (a data attack's poisoned copy) is the data
the algorithm is built and trained on, the test splits it adds are scored beside accuracy, the
model it makes the algorithm train (LoRA's adapters) is what one message is and how models are
scored, its per-round metrics (ε) are added to every row and final summary, and its memory (the
data's copy, a blockwise aggregator's cohort blocks) is counted in the run's estimate. The runner
(:mod:`fedtree.experiment.runner`), the run loop and the sweep driver then use the :class:`Run`
alone, without knowing any capability by name.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedtree import evaluation
from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.metrics import make_evaluator
from fedtree.experiment import capabilities as caps
from fedtree.experiment import memory, registry
from fedtree.experiment.capability import Capability, RunContext, Wrapping, blocks
from fedtree.experiment.context import Context
from fedtree.experiment.fields import field, run_field
from fedtree.experiment.results import evaluation_options, positive_classes_from_config
from fedtree.toolbox.traffic import model_bytes


class Scoring(NamedTuple):
  """How a run's models are scored (:func:`fedtree.evaluation.evaluate_models`).

  Attributes:
    evaluator: ``evaluator(state) -> evaluator`` of the models of ``state``
      (:func:`fedtree.core.metrics.make_evaluator`, or a capability's: adapters scored with the
      state's base as an argument).
    positive_classes: the keyword class mask of FA/FR rates, or ``None``.
    top_k: also report ``top{k}_accuracy``, or ``None``.
    central: ``(x, y, n)`` of the central test set in blocks, or ``None``.
    splits: ``{metric: (x, y, n)}`` further test splits scored as ``metric`` (a backdoor's).
    tasks: ``{name: (task, tokenizer)}`` language-model benchmarks (``config.tasks``,
      :func:`fedtree.experiment.llm.load_tasks`) every one-row model set is also scored on.
    forward: ``(forward, bind)`` applying one model of a state (:class:`Wrapping`'s ``forward``).
  """

  evaluator: Callable[[Any], Callable]
  positive_classes: Any = None
  top_k: int | None = None
  central: tuple | None = None
  splits: Mapping[str, tuple] = {}
  tasks: Mapping[str, tuple] = {}
  forward: tuple[Callable, Callable] | None = None

  def evaluate(self, algorithm: FederatedAlgorithm, state, ctx: Context, round_: int = 0
               ) -> dict[str, dict[str, Any]]:
    """Every model of ``state`` scored on the clients' test data of ``ctx`` (a streamed population's:
    the clients of the evaluation after round ``round_``, read from its store), and on the tasks."""
    if ctx.streamed:
      from fedtree.experiment.population import evaluate_streamed

      out = evaluate_streamed(algorithm, state, ctx.population, round_, model=ctx.model,
                              evaluator=self.evaluator(state), groups=ctx.groups,
                              positive_classes=self.positive_classes, top_k=self.top_k, central=self.central,
                              mesh=ctx.mesh)
    else:
      out = evaluation.evaluate_models(
        algorithm, state, ctx.model, ctx.run_data, groups=ctx.groups,
        chunk_size=field(ctx.config, "eval_chunk_size"), evaluator=self.evaluator(state),
        positive_classes=self.positive_classes, splits=self.splits, top_k=self.top_k, central=self.central)
    if self.tasks and self.forward is not None:
      from fedtree.evaluation.llm import score_tasks

      apply, bind = self.forward
      scores = score_tasks(algorithm.models(state), bind(state), apply, self.tasks)
      out = {name: {**s, **scores.get(name, {})} for name, s in out.items()}
    return out


@dataclasses.dataclass(frozen=True)
class Run:
  """One configured run, resolved (:func:`resolve`).

  Attributes:
    label: its label (``config.runs.<label>``).
    config: its config (``config.runs.<label>``).
    context: the shared context, with the data this run trains on (its capabilities' copy).
    algorithm: its algorithm (``None`` where a sweep builds one per setting).
    rounds: the rounds it runs (a fixed-length composition's own, else the run's ``rounds``).
    scoring: how its models are scored.
    round_metrics: ``r -> {name: number}`` its capabilities add to round ``r``'s row and to every
      final summary (the privacy spent), or ``None``.
    message_bytes: the bytes of one model a node sends uncompressed (the model the algorithm
      trains: adapters alone under LoRA).
    block: ``(param_bytes, rows, block_size, pairwise)`` of the cohort blocks a blockwise
      aggregator holds (:func:`fedtree.experiment.capability.blocks`), or ``None``.
    extra_data_bytes: bytes of the run's own copy of the clients' data beside the shared one.
    needs: what its method holds beyond one model's client step
      (:func:`fedtree.experiment.registry.memory_needs`: FedEM's components), or ``None``.
    run_context: what its capabilities see and its builders read, resolved once
      (:func:`fedtree.experiment.registry.resolved_context`: its config's capabilities, its tree,
      factory and config, on :attr:`context`), or ``None`` for an algorithm built by hand.
  """

  label: str
  config: Any
  context: Context
  algorithm: FederatedAlgorithm | None
  rounds: int
  scoring: Scoring
  round_metrics: Callable[[int], dict[str, Any]] | None = None
  message_bytes: int = 0
  block: tuple[int, int, int, bool] | None = None
  extra_data_bytes: int = 0
  needs: Any = None
  run_context: RunContext | None = None
  files: Mapping[str, str | bytes] = dataclasses.field(default_factory=dict)

  @property
  def capabilities(self) -> Mapping[str, Capability]:
    """The capabilities its config names, read once (``{}`` for an algorithm built by hand)."""
    return {} if self.run_context is None else self.run_context.capabilities

  def memory(self, budget: memory.Budget, key: jax.Array) -> str:
    """The run's memory line (:meth:`fedtree.experiment.memory.Budget.check`), refused with the
    numbers when it cannot fit."""
    from fedtree.core import loop

    streamed = (0, 0)
    if self.context.streamed:   # the windows read ahead, the reader's cache, an evaluation chunk's rows
      from fedtree.experiment.population import stream_bytes

      streamed = stream_bytes(self.algorithm, self.context.data, self.context.population,
                              int(field(self.context.config, "rounds_per_call")), key, mesh=self.context.mesh)
    return budget.check(self.label, jax.eval_shape(self.algorithm.init, loop.init_key(key)),
                        self.context.chunk_size(self.config), block=self.block,
                        extra_data_bytes=self.extra_data_bytes, needs=self.needs, streamed_bytes=streamed)


def scoring(ctx: Context, wrapped: Wrapping | None = None,
            splits: Mapping[str, tuple] | None = None) -> Scoring:
  """How the runs of ``ctx``'s config are scored (``config.metrics``, checked against the data),
  with a capability's evaluator (``wrapped``) and further test splits."""
  positive = positive_classes_from_config(ctx.config, ctx.data.num_classes)
  opts = evaluation_options(ctx.config, num_classes=ctx.data.num_classes,
                            has_central=ctx.central_test is not None,
                            has_local=int(np.asarray(ctx.data.n_test).sum()) > 0)
  options = {"ignore_labels": opts.ignore_labels, "top_k": opts.top_k}
  chunk = field(ctx.config, "eval_chunk_size")
  if wrapped is None:
    one = make_evaluator(ctx.model, chunk, confusion=positive is not None, **options)

    def evaluator(state):
      return one

    forward = (_plain_forward(ctx.model), lambda state: lambda params: params)
  else:
    evaluator = wrapped.evaluator(chunk, confusion=positive is not None, **options)
    forward = wrapped.forward
  central = None
  if opts.central:
    assert ctx.central_test is not None  # evaluation_options checked it
    central = tuple(jnp.asarray(a) for a in evaluation.central_blocks(*ctx.central_test))
  return Scoring(evaluator, positive, opts.top_k, central, dict(splits or {}), tasks=dict(ctx.tasks or {}),
                 forward=forward)


@functools.lru_cache(maxsize=32)
def _plain_forward(model) -> Callable:
  """``forward(params, tokens)`` of a model, one object per model (benchmarks compile it once)."""
  return lambda params, tokens: model.apply(params, tokens)


def _merged(hooks: list[Callable[[int], dict[str, Any]]]) -> Callable[[int], dict[str, Any]] | None:
  if not hooks:
    return None
  if len(hooks) == 1:
    return hooks[0]
  return lambda r: {k: v for h in hooks for k, v in h(r).items()}


def round_metrics(label: str, run_cfg, ctx) -> Callable[[int], dict[str, Any]] | None:
  """``r -> {name: number}`` of every capability of run ``label`` that reports per-round
  metrics (the privacy spent), or ``None``; ``ctx``: the run's context
  (:func:`fedtree.experiment.registry.resolved_context`), or a shared one."""
  rctx = registry.run_context(ctx, label, run_cfg)
  present = [(c, s) for c, s in caps.sections(run_cfg, rctx.capabilities) if c.round_metrics is not None]
  if not present:
    return None
  hooks = [h for h in (c.round_metrics(s, rctx) for c, s in present) if h is not None]
  return _merged(hooks)


def run_files(label: str, run_cfg, ctx) -> dict[str, str | bytes]:
  """``{file name: content}`` the capabilities of run ``label`` write into the workdir when it starts
  (a mobility section's membership); ``ctx``: the run's context, or a shared one."""
  rctx = registry.run_context(ctx, label, run_cfg)
  out: dict[str, str | bytes] = {}
  for cap, section in caps.sections(run_cfg, rctx.capabilities):
    if cap.files is not None:
      out.update(cap.files(section, rctx))
  return out


def run_data(rctx: RunContext) -> tuple[RunContext, dict[str, tuple]]:
  """``(the run on the data it trains on, {metric: test split})``: the data the capabilities of the
  run of ``rctx`` (:func:`fedtree.experiment.registry.resolved_context`) alter (a data attack's
  poisoned copy, on the device and over the context's mesh) and the test splits they add (its
  backdoor's)."""
  present = [(c, s) for c, s in caps.sections(rctx.run, rctx.capabilities) if c.data is not None]
  if not present:
    return rctx, {}
  own = rctx.shared
  data, splits = own.data, {}
  for cap, section in present:
    data, more = cap.data(section, rctx.on(dataclasses.replace(own, data=data)))
    splits.update(more)
  return rctx.on(own.with_data(data)), splits


def resolve(label: str, run_cfg, ctx: Context, *, build: bool = True) -> Run:
  """Run ``label`` (``config.runs.<label>``) resolved once on the shared context ``ctx``: checked,
  on its own context (its own data and model, when it sets them) and tree, the capabilities of
  the config read (:func:`fedtree.experiment.registry.resolved_context`), their sections read once
  (the data they alter, their update-path parts and factory arguments, the model they make it
  train, their metrics), its algorithm built (``build=False``: left to a sweep, which builds one per
  setting), how it is scored, its rounds and memory."""
  own = registry.resolved_context(label, run_cfg, ctx)
  rctx, splits = run_data(own)
  wrapped = registry.wrapping(label, run_cfg, rctx)
  arguments = registry.capability_arguments(label, run_cfg, rctx)
  algorithm = None
  if build:
    if wrapped is None:
      algorithm = registry.build_algorithm(label, run_cfg, rctx, arguments=arguments)
    else:
      algorithm = registry.wrapped_algorithm(label, *wrapped, rctx, arguments)
  fixed = algorithm.rounds if algorithm is not None else None
  rounds = int(fixed if fixed is not None else run_field(own.config, run_cfg, "rounds"))
  model = own.model if wrapped is None else wrapped[1].model
  full_model = memory.tree_bytes(jax.eval_shape(own.model.init, jax.random.key(0)))
  return Run(label=label, config=run_cfg, context=rctx.shared, algorithm=algorithm, rounds=rounds,
             scoring=scoring(rctx.shared, None if wrapped is None else wrapped[1], splits),
             round_metrics=round_metrics(label, run_cfg, own),
             message_bytes=model_bytes(jax.eval_shape(model.init, jax.random.key(0))),
             block=blocks(arguments.get("update_paths"), rctx, full_model, arguments.get("membership")),
             extra_data_bytes=memory.copied_bytes(rctx.data, ctx.data),
             needs=registry.memory_needs(label, run_cfg, own, arguments.get("update_paths")),
             run_context=rctx,
             files=run_files(label, run_cfg, own))


def of_algorithm(label: str, algorithm: FederatedAlgorithm, ctx: Context, *,
                 rounds: int | None = None) -> Run:
  """A run of an algorithm built by hand on ``ctx`` (no config run of its own): scored as the
  config says, its rounds ``rounds`` (default the algorithm's own, else the config's)."""
  if rounds is None:
    rounds = algorithm.rounds if algorithm.rounds is not None else int(ctx.config.rounds)
  one = model_bytes(jax.eval_shape(ctx.model.init, jax.random.key(0)))
  return Run(label=label, config=None, context=ctx, algorithm=algorithm, rounds=int(rounds),
             scoring=scoring(ctx), message_bytes=one)
