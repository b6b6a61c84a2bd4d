"""The algorithm interface every method implements, and the tree state they share (engine core:
importing this module imports no algorithm).

An algorithm is a :class:`FederatedAlgorithm`: pure ``init(key) -> state`` and
``round(state, data, key) -> (state, metrics)`` (jittable; ``key`` is already the round's
key), plus ``models(state)``, the models to evaluate and which client each one scores.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from fedtree.core.data import FederatedData, check_model_outputs
from fedtree.core.local import (
  ClientUpdate,
  LocalSchedule,
  check_client_update,
  check_model_state,
  sgd_client_update,
  stack,
)
from fedtree.core.model import Model
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdateState

PyTree = Any


class NodeModels(NamedTuple):
  """Stacked models ``params [N, ...]`` and ``model_of_client int32[C]`` (row scoring client c).

  A model set of a family may carry more, read by name where it is present: the clustered
  family's :class:`fedtree.algorithms.clustering.ops.ClusterModels` adds every client's cluster,
  and the evaluation then adds intra- and inter-cluster accuracy
  (:func:`fedtree.core.metrics.cluster_accuracy`).
  """

  params: PyTree
  model_of_client: np.ndarray | jax.Array


@struct.dataclass
class ScoredModels:
  """A model set whose predictions are not the run's ``model.apply(row, x)``: it carries the
  :class:`~fedtree.core.model.Model` that scores it (a mixture of components, a model interpolated
  with a per-client memory), and the evaluation uses that model instead of the run's
  (:func:`fedtree.evaluation.evaluate_models`).

  Attributes:
    params: stacked rows ``[N, ...]``, as :class:`NodeModels`' (e.g. the leaf parents' models).
    model_of_client: ``int32[C]`` the row scoring client ``c``.
    client_params: ``[C, ...]`` every client's own inputs of ``model`` (FedEM's mixture weights,
      kNN-Per's memory), or ``None``: client ``c`` is scored with ``model.apply((params[row],
      client_params[c]), x)``, else with ``model.apply(params[row], x)``
      (:func:`fedtree.core.metrics.evaluate`).
    model: the model that scores the set (static: not a leaf of the pytree; build it once, in the
      algorithm's factory, so that its evaluator compiles once).
  """

  params: PyTree
  model_of_client: np.ndarray | jax.Array
  client_params: PyTree = None
  model: Model = struct.field(pytree_node=False, default=None)


class Report(NamedTuple):
  """What an algorithm's ``report`` hook returns (pure: the experiment layer prints and writes).

  Attributes:
    summaries: the final ``{model name: summary}`` of the run (the standard summaries it was
      given, extended or replaced, in the order to report them).
    text: printed after the run (a table); ``""`` for none.
    files: ``{file name: str | bytes}`` written into the workdir when there is one.
  """

  summaries: dict[str, dict[str, Any]]
  text: str = ""
  files: dict[str, str | bytes] = {}


class Reads(NamedTuple):
  """Which clients a round reads (their data and their per-client state), for a population held in a
  window (:attr:`fedtree.core.data.FederatedData.window`, :mod:`fedtree.population`).

  Attributes:
    clients: ``clients(state, key) -> int32[D]`` every client the round of ``key`` (the round's key,
      as the loop gives it) may read, repeats allowed.
    needs_state: whether ``clients`` needs the state the round starts from (then a round's clients
      are known only once the round before it has run); ``False``: any state of the run gives them.
  """

  clients: Callable[[Any, jax.Array], jax.Array]
  needs_state: bool = False


class ClientModels(NamedTuple):
  """An algorithm's per-client model sets (a row per client: personal models) for some clients only,
  so that a population held on disk scores them chunk by chunk with their rows paged in
  (:mod:`fedtree.population`) instead of holding every client's row.

  Attributes:
    of: the ``models`` these sets belong to; a wrapper that replaces an algorithm's ``models`` leaves
      them stale, and they are then not used (:meth:`FederatedAlgorithm.client_sets`).
    sets: ``sets(state, clients) -> {name: NodeModels}`` over a state whose per-client leaves hold the
      rows of the clients ``clients`` (``int32[K]``) in that order: each set's ``model_of_client`` has
      ``K`` entries, the ``k``-th scoring client ``clients[k]`` as ``of(state)`` scores it over every
      client (per-client inputs, ``ScoredModels.client_params``, ``K`` rows too).
    nodes: ``nodes(state) -> {name: NodeModels}``: the other sets of ``of(state)`` (a row per server
      node), which a state over a window of clients makes too.
  """

  of: Callable[[Any], dict[str, NodeModels]]
  sets: Callable[[Any, jax.Array], dict[str, NodeModels]]
  nodes: Callable[[Any], dict[str, NodeModels]]


class FederatedAlgorithm(NamedTuple):
  """``init(key) -> state``; ``round(state, data, key) -> (state, metrics)``;
  ``models(state) -> {name: NodeModels}``. ``name`` labels reports.

  ``reads`` (optional, :class:`Reads`): which clients a round reads, so that a population held on
  disk streams their rows in before it; ``None``: the algorithm reads every client (it cannot stream).

  ``client_models`` (optional, :class:`ClientModels`): the per-client sets of ``models`` for some
  clients only (a streamed population scores them chunk by chunk).

  ``report`` (optional): ``report(state, data, key, summaries) -> Report``, called once on the
  final state with the run's root key and the standard summaries of ``models(state)``, for
  extra tables such as B-HFL's accuracy by level or GroupPerFL's four methods and costs.
  The experiment runner passes this process's copies of the state and the data (gathered
  when they span the processes of a multi-host run), so a report may read them on the host.

  Example:
    The smallest algorithm: a round counter and one scalar, one gradient step a round:

    >>> from typing import NamedTuple
    >>> class Toy(NamedTuple):
    ...   round: jax.Array  # int32[]
    ...   w: jax.Array      # []
    >>> def one_round(state, data, key):   # a step of gradient descent on (w - 3)^2
    ...   return Toy(state.round + 1, state.w - 0.25 * (state.w - 3.0)), {"train_loss": (state.w - 3.0) ** 2}
    >>> toy = FederatedAlgorithm(init=lambda key: Toy(jnp.zeros((), jnp.int32), jnp.zeros(())),
    ...                          round=one_round, models=lambda state: {}, name="toy")
    >>> state = loop.run(toy, None, num_rounds=2, key=jax.random.key(0))
    >>> int(state.round), float(state.w)
    (2, 1.3125)
  """

  init: Callable[[jax.Array], Any]
  round: Callable[[Any, FederatedData, jax.Array], tuple[Any, dict[str, jax.Array]]]
  models: Callable[[Any], dict[str, NodeModels]]
  name: str = "algorithm"
  report: Callable[[Any, FederatedData, jax.Array, dict], Report] | None = None
  rounds: int | None = None  # a composition of fixed length (sequential): its number of rounds
  reads: Reads | None = None
  client_models: ClientModels | None = None

  def client_sets(self) -> ClientModels | None:
    """``client_models`` where they belong to this algorithm's ``models``, else ``None``."""
    cm = self.client_models
    return cm if cm is not None and cm.of is self.models else None


@dataclasses.dataclass(frozen=True)
class RowName:
  """How error messages name the rows (leading axis) of a part of an algorithm's state.

  A state names its rows with a ``row_names()`` method returning a prefix of its own pytree
  whose leaves are :class:`RowName` (see :func:`state_row_names`): e.g. ``TreeState.params[1]``
  is ``RowName("node", "server level 1")``, so the divergence check of
  :func:`fedtree.core.loop.run` says ``server level 1, node 3`` without parsing key paths.

  Attributes:
    noun: what one row is (``"node"``, ``"client"``, ``"cluster"``, ``"team"``).
    where: the part of the state, when the noun alone does not say it (``"server level 1"``).
  """

  noun: str
  where: str = ""

  def row(self, row: int) -> str:
    """Row ``row`` alone: ``"server level 1, node 3"``, ``"client 3"``."""
    return f"{self.where}, {self.noun} {row}" if self.where else f"{self.noun} {row}"

  def part(self) -> str:
    """The part without a row (a sweep names the row, its experiment): ``"server level 1"``,
    ``"client state"``."""
    return self.where or f"{self.noun} state"


UNNAMED = RowName("row")
"""A part of a state whose rows have no name of their own (a counter, a single model)."""


def state_row_names(state) -> list[RowName]:
  """The :class:`RowName` of every leaf of ``state`` (in ``jax.tree.leaves`` order): from its
  ``row_names()`` prefix when it declares one, else :data:`UNNAMED` for every leaf."""
  is_name = lambda x: isinstance(x, RowName)  # noqa: E731
  per_leaf = jax.tree.map(lambda name, sub: [name] * len(jax.tree.leaves(sub)), row_names_of(state), state,
                          is_leaf=is_name)
  return jax.tree.leaves(per_leaf, is_leaf=is_name)


def node_rows(level: int) -> RowName:
  """The rows of a stacked server level: its nodes."""
  return RowName("node", f"server level {level}")


CLIENT_ROWS = RowName("client")
"""The rows of per-client state (``[C, ...]``)."""


def path_rows(state, children: RowName, parents: RowName):
  """The rows of an update path's state ``state`` (a :class:`~fedtree.core.updates.UpdateState`:
  its client stage's per-child state, its node stage's per-parent state); a state that holds no
  path (``()``) names nothing."""
  if not isinstance(state, UpdateState):
    return state
  return UpdateState(client=children, node=parents)


@struct.dataclass
class TreeState:
  """Models and server-optimizer states of every server level of a tree.

  Attributes:
    round: ``int32[]`` rounds completed.
    params: per server level ``l = 0 .. depth-1``, stacked models ``[N_l, ...]``.
    opt_state: per server level, stacked optimizer states ``[N_l, ...]``.
    client_state: persistent per-client state ``[C, ...]`` (``()`` if none).
    cursor: ``int32[C]`` every client's batch cursor under ``batch_order="cyclic"``
      (:meth:`fedtree.core.local.LocalSchedule.init_cursor`; ``()`` for the other orders).
    update_state: per server level, the :class:`~fedtree.core.updates.UpdateState` of the update
      path it aggregates its children through (``()`` entries hold nothing: no path).
    clock: ``float[]`` simulated seconds since the start, in the default float dtype
      (:mod:`fedtree.toolbox.systems`; ``()`` without a systems model).
    server_state: the state of the clients' parents' server rule (:mod:`fedtree.core.server_rule`:
      SCAFFOLD's control variates, FedDyn's ``h``), ``[N, ...]``; ``()`` without a rule.
    personal: every client's personal parameters (:mod:`fedtree.core.personal`), a tuple of the
      personal leaves in leaf order, each ``[C, ...]``; ``()`` without personal parameters.
  """

  round: jax.Array
  params: tuple
  opt_state: tuple
  client_state: Any = ()
  cursor: Any = ()
  update_state: tuple = ()
  clock: Any = ()
  server_state: Any = ()
  personal: Any = ()

  def row_names(self) -> TreeState:
    """Rows of every part: server level ``l``'s nodes, the clients (:class:`RowName`)."""
    # a prefix of the state with names for leaves (as vmap's in_axes are): not arrays
    depth = len(self.params)
    return TreeState(round=UNNAMED, params=tuple(node_rows(lv) for lv in range(depth)),  # type: ignore[arg-type]
                     opt_state=tuple(node_rows(lv) for lv in range(len(self.opt_state))),
                     client_state=CLIENT_ROWS, cursor=CLIENT_ROWS,
                     update_state=tuple(path_rows(st, CLIENT_ROWS if lv == depth - 1 else node_rows(lv + 1),
                                                  node_rows(lv)) for lv, st in enumerate(self.update_state)),
                     clock=UNNAMED if isinstance(self.clock, jax.Array) else self.clock,
                     server_state=node_rows(depth - 1), personal=CLIENT_ROWS)


def per_level(value, depth: int, name: str) -> tuple:
  """``value`` for every server level ``0 .. depth-1``: one value, or a sequence of ``depth``."""
  if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):  # NamedTuples are values
    if len(value) != depth:
      raise ValueError(f"{name} has {len(value)} entries for {depth} server levels (0..{depth - 1})")
    return tuple(value)
  return (value,) * depth


def broadcast_tree(init_params: PyTree, topology: Topology) -> tuple:
  """The same model at every node of every server level: ``params[l]`` is ``[N_l, ...]``."""
  return tuple(stack(init_params, topology.num_nodes(lv)) for lv in range(topology.depth))


class LocalSetup(NamedTuple):
  """What a host builds a local objective from (an objective factory given to
  :func:`local_training` receives it): the model, the local optimizer (``None`` when the host was
  given none), the schedule's batch size and static step count on the data, and the run's
  ``compute_dtype``."""

  model: Model
  optimizer: optax.GradientTransformation | None
  batch_size: int
  max_steps: int
  compute_dtype: str | None = None


ObjectiveFactory = Callable[[LocalSetup], ClientUpdate]
"""A local objective not built yet: ``factory(setup) -> ClientUpdate`` (e.g. FedProx's, given ``μ``)."""


def local_training(
  client_update: ClientUpdate | ObjectiveFactory | None, model: Model,
  local_optimizer: optax.GradientTransformation | None, schedule: LocalSchedule, data: FederatedData, *,
  compute_dtype=None, stateless_for: str | None = None, name: str = "the algorithm",
) -> ClientUpdate:
  """``client_update``, or by default plain SGD local training for ``schedule`` on ``data``
  (mixed precision in ``compute_dtype`` when given).

  ``client_update`` may be an :data:`ObjectiveFactory`: it is then built here from the
  :class:`LocalSetup` (the model, ``local_optimizer``, the schedule's batch size and step count,
  ``compute_dtype``). ``compute_dtype`` otherwise configures the default update only: an explicit
  ``client_update`` with a ``compute_dtype`` is refused (build the objective with its own
  ``compute_dtype``). With ``stateless_for`` (the algorithm's name), an update that keeps
  per-client state is refused: in those algorithms clients hold nothing but the model they
  receive. A model whose number of outputs differs from the data's classes is refused here,
  before anything compiles (:func:`fedtree.core.data.check_model_outputs`), and so is a model with
  state (BatchNorm statistics) under an update that does not train it
  (:func:`fedtree.core.local.check_model_state`).
  """
  check_model_outputs(model, data)
  setup = LocalSetup(model=model, optimizer=local_optimizer, batch_size=schedule.batch_size,
                     max_steps=schedule.max_steps(data.max_train), compute_dtype=compute_dtype)
  if client_update is None:
    if local_optimizer is None:
      raise ValueError(f"{name}: local_optimizer=None, but the default local training needs one (or give a "
                       f"client_update)")
    client_update = sgd_client_update(
      model, local_optimizer, batch_size=setup.batch_size, max_steps=setup.max_steps,
      compute_dtype=compute_dtype,
    )
  elif not isinstance(client_update, ClientUpdate):
    client_update = client_update(setup)
  elif compute_dtype is not None:
    raise ValueError(
      f"compute_dtype={compute_dtype!r} configures the default local training; with an explicit "
      f"client_update, pass compute_dtype to the objective's factory instead"
    )
  if stateless_for is not None:
    check_client_update(client_update, stateless_for, own_model=False, stateless=True)
  return check_model_state(client_update, model, stateless_for or name)


def initial_params(model: Model, key: jax.Array, init_params: PyTree | None) -> PyTree:
  """``init_params`` when given (a pytree to start from), else ``model.init(key)``."""
  return model.init(key) if init_params is None else init_params


def personal_models(client_update: ClientUpdate, client_state) -> dict[str, NodeModels]:
  """``{"personal": NodeModels}`` when ``client_update`` declares personal models, else ``{}``."""
  if client_update.personal_models is None:
    return {}
  personal = client_update.personal_models(client_state)
  num_clients = jax.tree.leaves(personal)[0].shape[0]
  return {"personal": NodeModels(personal, np.arange(num_clients, dtype=np.int32))}


WEIGHTINGS = ("examples", "uniform")


def check_weighting(weighting: str) -> str:
  """``weighting`` if it is one of :data:`WEIGHTINGS`, else a ``ValueError`` naming it (a
  factory calls it at construction)."""
  if weighting not in WEIGHTINGS:
    raise ValueError(f"weighting={weighting!r}; choose 'examples' or 'uniform'")
  return weighting


def client_weights(n_train: jax.Array, weighting: str) -> jax.Array:
  """Aggregation weight of every client: its number of examples (``"examples"``), or 1
  (``"uniform"``)."""
  if check_weighting(weighting) == "examples":
    return n_train.astype(jnp.result_type(float))
  return jnp.ones(n_train.shape, jnp.result_type(float))


# ------------------------------------------------------------------------ compositions
@struct.dataclass
class StagesState:
  """State of a :func:`sequential` composition.

  Attributes:
    round: ``int32[]`` rounds completed over all stages.
    stages: every stage's own state (a stage not started yet holds its start state).
  """

  round: jax.Array
  stages: tuple

  def row_names(self) -> StagesState:
    return StagesState(round=UNNAMED, stages=tuple(row_names_of(st) for st in self.stages))  # type: ignore[arg-type]


def row_names_of(state):
  """``state.row_names()`` (a prefix of ``state`` with :class:`RowName` leaves), or
  :data:`UNNAMED` for a state that names none (a composite state nests its parts' names)."""
  declare = getattr(state, "row_names", None)
  return UNNAMED if declare is None else declare()


def sequential(
  stages: Sequence[tuple[FederatedAlgorithm, int]],
  handoffs: Sequence[Callable[[Any, Any], Any]],
  models: Callable[[tuple], dict[str, NodeModels]],
  *, name: str = "sequential",
) -> FederatedAlgorithm:
  """Stages run one after the other as one algorithm: ``stages[i] = (algorithm, rounds)``.

  ``handoffs[i](state_i, state_{i+1}) -> state_{i+1}`` starts stage ``i+1`` from stage ``i``
  (e.g. its model). While stage ``i`` runs, the later stages' states are re-derived from it
  after every round, so each stage starts from its predecessor's final state; the round runs
  the current stage's round under ``lax.switch`` (one compiled program, checkpoints and
  resume across stage boundaries for free). Every stage's ``round`` must return metrics of
  the same structure; the composite adds ``stage`` (``int32[]``). ``models(stage_states)``
  names the models to evaluate. The composite has ``rounds`` = the sum of the stages'.
  """
  stages = tuple(stages)
  if not stages:
    raise ValueError("sequential needs at least one stage")
  if len(handoffs) != len(stages) - 1:
    raise ValueError(f"{len(stages)} stages need {len(stages) - 1} handoffs, got {len(handoffs)}")
  for alg, n in stages:
    if int(n) < 0:
      raise ValueError(f"stage {alg.name!r}: rounds={n} must be >= 0")
  ends = np.cumsum([int(n) for _, n in stages])

  def cascade(states: list, start: int) -> list:
    for j in range(start, len(stages) - 1):
      states[j + 1] = handoffs[j](states[j], states[j + 1])
    return states

  def init(key):
    keys = jax.random.split(key, len(stages))
    states = [alg.init(k) for (alg, _), k in zip(stages, keys, strict=True)]
    return StagesState(round=jnp.zeros((), jnp.int32), stages=tuple(cascade(states, 0)))

  def round_fn(state: StagesState, data: FederatedData, key):
    def branch(i):
      def run(st):
        states = list(st)
        states[i], metrics = stages[i][0].round(states[i], data, key)
        return tuple(cascade(states, i)), metrics

      return run

    index = jnp.minimum(jnp.sum(state.round >= jnp.asarray(ends[:-1])), len(stages) - 1)
    states, metrics = jax.lax.switch(index, [branch(i) for i in range(len(stages))], state.stages)
    metrics = {**metrics, "stage": index.astype(jnp.int32)}
    return StagesState(round=state.round + 1, stages=states), metrics

  return FederatedAlgorithm(init=init, round=round_fn, models=lambda st: models(st.stages), name=name,
                            rounds=int(ends[-1]))
