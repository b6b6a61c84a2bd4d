"""Test helpers shared by several test files (import as ``from helpers import ...``; the tests
directory is on ``sys.path`` under pytest's default rootdir-relative imports)."""

import jax
import numpy as np

# ALGORITHM_CASES: the smallest run config of every registered algorithm (the library's, which the
# composition matrix probes): test_conformance's cases and tests/multihost_config.py's runs
from fedtree.experiment.registry.cases import SMALLEST as ALGORITHM_CASES  # noqa: F401


def close(a, b, tol=1e-5):
  """Every leaf of ``a`` within ``tol`` (absolute and relative) of ``b``'s (compared in float64)."""
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=tol, atol=tol)


def trees_equal(a, b):
  """``a`` and ``b`` have the same structure and bitwise equal leaves."""
  assert jax.tree.structure(a) == jax.tree.structure(b), (jax.tree.structure(a), jax.tree.structure(b))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x, y = jax.random.key_data(x), jax.random.key_data(y)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def np_grad(kernel, bias, x, y):
  """Gradient of the mean softmax cross-entropy of ``x @ kernel + bias``, by hand (numpy)."""
  z = x @ kernel + bias
  p = np.exp(z - z.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  p[np.arange(len(y)), y] -= 1.0
  return x.T @ p / len(y), p.mean(0)


def row(tree, *idx):
  """Row ``idx`` of every leaf of a stacked ``tree``."""
  return jax.tree.map(lambda a: a[idx], tree)


def clipped(c):
  """``f(tree) -> tree`` scaled by ``min(1, c / ‖tree‖)``, the L2 norm over all its leaves: a client
  stage's clip in numpy, of one update or of a pair sent as one (SCAFFOLD's, MimeLite's)."""
  def clip(tree):
    norm = np.sqrt(sum(float(np.sum(np.square(np.asarray(a, np.float64)))) for a in jax.tree.leaves(tree)))
    return jax.tree.map(lambda a: a * min(1.0, c / norm), tree)
  return clip


def count_traces(alg):
  """``(alg with a counting round, traces)``: ``len(traces)`` is how often ``round`` was traced."""
  traces = []
  counted = alg._replace(round=lambda s, d, k: (traces.append(1), alg.round(s, d, k))[1])
  return counted, traces


def host_copy(tree):
  """``tree`` through host memory and back (what a checkpoint round trip does to a state)."""
  return jax.tree.map(lambda a: jax.device_put(np.asarray(a)) if not _is_key(a) else a, tree)


def _is_key(a) -> bool:
  return isinstance(a, jax.Array) and jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key)


def client_data(data, c):
  """Client ``c``'s training split of ``data`` as one ``ClientData`` (a reference loop's input)."""
  from fedtree.core.local import ClientData

  return ClientData(data.x_train[c], data.y_train[c], data.n_train[c])


_TIER = ("path", "chunk_size", "parent_aligned", "batch_order", "batch_size", "skip_nonfinite", "block_size",
         "learning_rate", "personal", "keep_client_params")
_DOWN = {"broadcast": "broadcast", "anchor_params": "anchor", "slot_start": "start", "slot_extra": "extra",
         "population": "population"}
_CLIENTS = {"num_steps": "num_steps", "weights": "weights", "client_state": "state", "cursor": "cursor",
            "personal_params": "personal", "update_state": "update_state"}


def tier_kw(update, parent_params, cohort, data, *, key, **kw):
  """``train_cohort`` called with its inputs as keywords (the tests' spelling): each goes into the
  record it belongs to (:class:`~fedtree.core.tier.Tier`, ``Down``, ``Clients``), an unknown one fails."""
  from fedtree.core.tier import Clients, Down, Tier, train_cohort

  unknown = set(kw) - set(_TIER) - set(_DOWN) - set(_CLIENTS)
  assert not unknown, unknown
  tier = Tier(update, **{k: v for k, v in kw.items() if k in _TIER})
  down = Down(parent_params, **{_DOWN[k]: v for k, v in kw.items() if k in _DOWN})
  clients = Clients(**{_CLIENTS[k]: v for k, v in kw.items() if k in _CLIENTS})
  return train_cohort(tier, down, cohort, data, clients, key)


def one_server_tier(update, data, start, key, schedule, client_state=()):
  """``train_cohort`` of every client of ``data`` from one server's model ``start``, weighted by
  examples, keeping every slot's trained model (slots in the order of the sampler's clients)."""
  import jax.numpy as jnp

  from fedtree.core.sampling import cohort_sampler

  sampler = cohort_sampler(np.zeros(data.num_clients, np.int32), None)
  return tier_kw(update, jax.tree.map(lambda a: a[None], start), sampler(key), data,
                      num_steps=schedule.num_steps(data.n_train),
                      weights=data.n_train.astype(jnp.float32), key=key,
                      client_state=client_state, keep_client_params=True)


def tiny_mlp_problem(batch_size=4):
  """``(data, model, schedule)``: 5 synthetic clients in two groups (4 features, 3 classes,
  3-11 examples), a one-hidden-layer MLP and one local epoch, the small problem of the
  FedKWS-UI, ALO and FedMMD tests."""
  from fedtree.core.data import as_device
  from fedtree.core.local import LocalSchedule
  from fedtree.datasets.synthetic import grouped_synthetic
  from fedtree.models import build_model

  data, _ = grouped_synthetic(group_sizes=(3, 2), dim=4, num_classes=3, mean_examples=8,
                              min_examples=3, max_examples=11, test_examples=4, seed=1)
  data = as_device(data)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(4,))
  return data, model, LocalSchedule(batch_size=batch_size, epochs=1)


def hierfavg_config(rounds=4):
  """The quickstart's HierFAVG run alone, shrunk (3 groups of 8 clients, an 8-unit MLP), with
  checkpoints every 2 rounds: the run of the resume, memory and command-line tests."""
  import ml_collections
  from config_files import load_config

  c = load_config("quickstart")
  c.rounds, c.eval_every, c.rounds_per_call, c.checkpoint_every, c.progress = rounds, 2, 1, 2, False
  c.data.group_sizes = (4, 2, 2)
  c.data.dim, c.data.max_examples, c.data.test_examples = 8, 20, 8
  c.model.hidden = (8,)
  c.runs = ml_collections.ConfigDict({"hierfavg": c.runs.hierfavg})
  c.run_order = ("hierfavg",)
  c.runs.hierfavg.cohort_size, c.runs.hierfavg.periods = 2, (2,)
  return c


def tensorboard_steps(folder) -> dict[str, list[int]]:
  """``{tag: [step, ...]}`` of the scalars in every TensorBoard event file directly in ``folder``
  (TFRecord framing read by hand, events decoded with tensorboardX's protos), in file order."""
  import struct

  from tensorboardX.proto import event_pb2

  out: dict[str, list[int]] = {}
  for path in sorted(folder.glob("events.out.tfevents.*")):
    data = path.read_bytes()
    pos = 0
    while pos + 12 <= len(data):
      (n,) = struct.unpack("<Q", data[pos:pos + 8])
      event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + n])
      pos += 12 + n + 4
      if event.file_version and event.step:  # a resumed writer's purge_step: TensorBoard drops
        out = {t: [s for s in steps if s < event.step] for t, steps in out.items()}  # steps >= it
      for v in event.summary.value:
        out.setdefault(v.tag, []).append(int(event.step))
  return out


def poisoned_problem():
  """``(model, data, bad)``: 6 synthetic clients, an MLP, and the data with client 1's features
  NaN (its local training diverges)."""
  from fedtree.core.data import as_device
  from fedtree.datasets.synthetic import grouped_synthetic
  from fedtree.models import build_model

  data, _ = grouped_synthetic(group_sizes=(3, 3), dim=4, num_classes=3, mean_examples=6,
                              min_examples=3, max_examples=8, test_examples=3, seed=1)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(4,))
  data = as_device(data)
  bad = data.replace(x_train=data.x_train.at[1].set(np.nan))  # client 1 diverges
  return model, data, bad


def small_context():
  """The registry context several test files build algorithms from run configs on: 6 synthetic
  clients in 2 groups (4 features, 3 classes), a 4-unit MLP, 2 local SGD steps of 4 examples."""
  import ml_collections
  import optax

  from fedtree.core.data import as_device
  from fedtree.core.local import LocalSchedule
  from fedtree.core.topology import Topology
  from fedtree.datasets.synthetic import grouped_synthetic
  from fedtree.experiment.runner import Context
  from fedtree.models import build_model

  data, groups = grouped_synthetic(group_sizes=(3, 3), dim=4, num_classes=3, mean_examples=8,
                                   min_examples=3, max_examples=12, test_examples=4, seed=5)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(4,))
  config = ml_collections.ConfigDict(dict(   # what the context holds (a run's own model is built from it)
    seed=0, rounds=4, local=dict(optimizer="sgd", learning_rate=0.05, batch_size=4, steps=2), runs={},
    data=dict(name="grouped_synthetic", group_sizes=(3, 3), dim=4, num_classes=3, mean_examples=8,
              min_examples=3, max_examples=12, test_examples=4, seed=5),
    topology=dict(kind="groups"), model=dict(name="mlp", hidden=(4,))))
  return Context(config=config, data=as_device(data), groups=np.asarray(groups),
                 topology=Topology.from_labels(groups), model=model, local_optimizer=optax.sgd(0.05),
                 schedule=LocalSchedule(batch_size=4, steps=2))


def with_update_paths(ctx, name, update_paths):
  """Algorithm ``name`` (its :data:`ALGORITHM_CASES` run, chunks of 3) built by the registry on
  ``ctx``, with ``update_paths`` given to its factory (``None``: none)."""
  import ml_collections

  from fedtree.experiment import registry

  run = ml_collections.ConfigDict({"algorithm": name, "chunk_size": 3, **ALGORITHM_CASES[name]})
  spec = registry.SPECS[name]
  if "adapters" in run:   # a method on LoRA adapters: built on the adapters, the base frozen (issue 50)
    import dataclasses

    inner, wrap = registry.wrapping(name, run, ctx)

    def make(model):
      kw = registry.factory_kwargs(name, inner, dataclasses.replace(ctx, model=model, init_params=None))
      if update_paths is not None:
        kw["update_paths"] = update_paths
      return spec.factory(**kw)

    return wrap.build(make)
  kw = registry.factory_kwargs(name, run, ctx)
  if update_paths is not None:
    kw["update_paths"] = update_paths
  built = spec.factory(**kw)
  return spec.wrap(built, name, run, ctx) if spec.wrap is not None else built
