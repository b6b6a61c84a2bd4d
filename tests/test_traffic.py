"""Bytes on every edge of the tree (fedtree.toolbox.traffic): hand-counted on a 3-level HierFAVG
with periods, compressed or not; fused rounds and skipped clients counted exactly; a resumed run
continues its totals."""

import jax
import jax.numpy as jnp
import ml_collections
import pytest
from test_updates import _ctx

from fedtree.algorithms import hierfavg
from fedtree.core import loop
from fedtree.experiment import registry
from fedtree.toolbox.traffic import Traffic, model_bytes

MB = 1e6


def _hierfavg(ctx, **run):
  cfg = ml_collections.ConfigDict({"algorithm": "hierfavg", "periods": (2,), "chunk_size": 3, **run})
  return hierfavg(**registry.factory_kwargs("h", cfg, ctx))


def _count(alg, data, *, rounds, per_call):
  """(Traffic fed by the loop's ``on_rounds``, every round's metrics as host numbers)."""
  t = Traffic(140)
  rows = []

  def on_rounds(first, metrics):
    t.add_rounds(first, metrics)
    rows.extend({k: v[i].item() for k, v in metrics.items()} for i in range(len(metrics["clients_trained"])))

  loop.run(alg, data, num_rounds=rounds, key=jax.random.key(0), rounds_per_call=per_call,
           on_rounds=on_rounds)
  return t, rows


@pytest.fixture(scope="module")
def ctx():
  return _ctx()


def test_model_bytes_by_hand(ctx):
  # mlp 4 -> 4 -> 3 in float32: (16 + 4 + 12 + 3) * 4 bytes
  assert model_bytes(ctx.model.init(jax.random.key(0))) == 140


@pytest.mark.parametrize("compressed", [False, True])
def test_every_edge_of_a_three_level_tree_by_hand(ctx, compressed):
  """root -> 2 edge servers -> 6 clients, the root every 2 rounds, 4 rounds: each round 6 clients
  get the edge's model and send theirs back; in rounds 2 and 4 the 2 edges send their models to the
  root and get its model back. Uncompressed, every message is the model (140 bytes). Compressed:
  8-bit qsgd from the clients (per leaf 8 n + 64 bits: (8·(16+4+12+3) + 4·64) / 8 = 67 bytes),
  fp16 from the edges to the root (70 bytes); what is sent down stays the model."""
  compression = {}
  if compressed:
    compression = {"compression": {"levels": {"-1": {"uplink": {"name": "qsgd", "bits": 8}},
                                              "0": {"uplink": {"name": "fp16"}}}}}
  t, _ = _count(_hierfavg(ctx, **compression), ctx.data, rounds=4, per_call=4)
  client_up, edge_up = (67, 70) if compressed else (140, 140)
  s = t.summary()
  assert s["clients_uplink_MB"] == 4 * 6 * client_up / MB
  assert s["clients_downlink_MB"] == 4 * 6 * 140 / MB
  assert s["level0_uplink_MB"] == 2 * 2 * edge_up / MB
  assert s["level0_downlink_MB"] == 2 * 2 * 140 / MB
  assert s["uplink_MB"] == (4 * 6 * client_up + 2 * 2 * edge_up) / MB
  assert s["downlink_MB"] == (4 * 6 + 2 * 2) * 140 / MB
  last = t.row()   # round 4: the root aggregated
  assert last["round_uplink_MB"] == (6 * client_up + 2 * edge_up) / MB
  assert last["level0_round_downlink_MB"] == 2 * 140 / MB and last["uplink_bytes"] == client_up


def test_fused_rounds_and_skipped_clients_count_exactly(ctx):
  """Client 1's data are NaN (skipped every round it is sampled), 2 of 3 clients sampled per edge,
  the root every 2 rounds: 10 rounds fused 5 a call count exactly what 10 calls of 1 count (the
  last round of a call times its length would count 10 root rounds, not 5)."""
  bad = ctx.data.replace(x_train=ctx.data.x_train.at[1].set(jnp.nan))
  alg = _hierfavg(ctx, cohort_size=2, skip_nonfinite=True)
  one, rows = _count(alg, bad, rounds=10, per_call=1)
  five, _ = _count(alg, bad, rounds=10, per_call=5)
  assert one.summary() == five.summary()
  skipped = [r["clients_skipped"] for r in rows]
  assert 0 < sum(skipped) < 10 and len(set(skipped)) > 1   # the count varied across rounds
  assert [r["level0_children_sent"] for r in rows] == [0, 2] * 5
  # every sampled client (trained or skipped) got the model and sent: 10 rounds x 4 clients
  assert one.summary()["clients_downlink_MB"] == 10 * 4 * 140 / MB
  assert one.summary()["uplink_MB"] == (10 * 4 + 5 * 2) * 140 / MB


def test_a_resumed_finished_run_reports_its_bytes(tmp_path):
  """A run resumed from its checkpoint (and a finished run run again) continue the byte totals
  from the row of the round they resume at."""
  import json

  from fedtree.experiment.runner import train_and_evaluate

  def config(rounds):
    return ml_collections.ConfigDict(dict(
      seed=0, rounds=rounds, eval_every=2, rounds_per_call=2, progress=False, plots=False,
      checkpoint_every=2,
      data=dict(name="grouped_synthetic", group_sizes=(3, 2), dim=8, num_classes=3),
      topology=dict(kind="groups"), model=dict(name="logreg"),
      local=dict(optimizer="sgd", learning_rate=0.1, batch_size=8, steps=1),
      runs=dict(q8=dict(algorithm="fedavg", compression=dict(uplink=dict(name="qsgd", bits=8))))))

  train_and_evaluate(config(2), str(tmp_path))
  again = train_and_evaluate(config(2), str(tmp_path))        # finished: nothing runs
  assert again["q8"]["global"]["uplink_MB"] == 43 * 5 * 2 / MB
  resumed = train_and_evaluate(config(4), str(tmp_path))      # rounds 3-4 on top of 1-2
  assert resumed["q8"]["global"]["uplink_MB"] == 43 * 5 * 4 / MB
  assert resumed["q8"]["global"]["downlink_MB"] == 108 * 5 * 4 / MB
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [(r["round"], r["uplink_MB"]) for r in rows] == [(2, 43 * 10 / MB), (4, 43 * 20 / MB)]


def _one_round(ctx, name):
  from test_updates import _with_path

  alg = _with_path(ctx, name, None)
  _, m = jax.jit(alg.round)(alg.init(jax.random.key(0)), ctx.data, jax.random.key(1))
  return {k: v.item() for k, v in m.items() if jnp.ndim(v) == 0}


@pytest.mark.slow   # three algorithms compiled: ~10-15 s
def test_edges_of_pfedmt_ifca_and_bhfl(ctx):
  """pFedMT (2 teams, K=2 team iterations): 6 devices x 2 round trips to their teams, then both
  teams to the global server and back. IFCA (k=2): every sampled client receives both cluster
  models. B-HFL (2 of 3 clients an edge, no latency): both edges aggregate, send up, the root
  sends back to both, and every client (6, sampled or not) receives its edge's merged model."""
  t = Traffic(140)
  t.add(_one_round(ctx, "pfedmt"))
  s = t.summary()
  assert s["clients_uplink_MB"] == s["clients_downlink_MB"] == 12 * 140 / MB
  assert s["level0_uplink_MB"] == s["level0_downlink_MB"] == 2 * 140 / MB
  m = _one_round(ctx, "ifca")
  t = Traffic(140)
  t.add(m)
  assert t.summary() == {"uplink_MB": m["clients_trained"] * 140 / MB,
                         "downlink_MB": m["clients_trained"] * 2 * 140 / MB}
  t = Traffic(140)
  m = _one_round(ctx, "bhfl")
  t.add(m)
  s = t.summary()
  assert (m["clients_trained"], m["clients_received"]) == (4, 6)
  assert s["clients_uplink_MB"] == 4 * 140 / MB and s["clients_downlink_MB"] == 6 * 140 / MB
  assert s["level0_uplink_MB"] == s["level0_downlink_MB"] == 2 * 140 / MB


def test_a_lora_run_counts_adapters_not_the_base(tmp_path):
  """With ``adapters`` a client sends and receives its adapters only: logistic regression on 8
  features and 3 classes with rank-1 adapters on its kernel: A [8, 1] + B [1, 3] = 11 float32 =
  44 bytes a message (the model itself is 108)."""
  import json

  from fedtree.experiment.runner import train_and_evaluate

  config = ml_collections.ConfigDict(dict(
    seed=0, rounds=2, eval_every=2, rounds_per_call=2, progress=False, plots=False,
    data=dict(name="grouped_synthetic", group_sizes=(3, 2), dim=8, num_classes=3),
    topology=dict(kind="groups"), model=dict(name="logreg"),
    local=dict(optimizer="sgd", learning_rate=0.1, batch_size=8, steps=1),
    runs=dict(lora=dict(algorithm="fedavg", adapters=dict(kind="lora", rank=1)))))
  summary = train_and_evaluate(config, str(tmp_path))
  row = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")][-1]
  assert row["uplink_bytes"] == row["downlink_bytes"] == 44.0
  assert summary["lora"]["global"]["uplink_MB"] == 44 * 5 * 2 / MB


def test_an_edge_is_its_messages_times_one_message():
  """The host multiplies what a round reports on every edge, nothing else: the counts the rounds
  report beside them (``clients_trained``, ``level0_children_sent``) and other metrics ending
  alike are not edges; one message is the model where the round gives no size."""
  from fedtree.core.tier import edge_metrics

  m = {**edge_metrics("clients", 3, 5, downlink_bytes=2.5), **edge_metrics("level1", 2, uplink_bytes=70),
       "clients_trained": 9, "level0_children_sent": 4, "stage/clients_uplink_messages": 7}
  t = Traffic(140)
  t.add({k: v.item() if hasattr(v, "item") else v for k, v in m.items()})
  assert t.summary() == {"uplink_MB": (3 * 140 + 2 * 70) / MB, "downlink_MB": (5 * 2.5 + 2 * 140) / MB,
                         "clients_uplink_MB": 3 * 140 / MB, "clients_downlink_MB": 5 * 2.5 / MB,
                         "level1_uplink_MB": 2 * 70 / MB, "level1_downlink_MB": 2 * 140 / MB}
  assert (t.row()["uplink_bytes"], t.row()["downlink_bytes"]) == (140, 2.5)
  t = Traffic(140)
  t.add({"clients_trained": 9, "level0_children_sent": 4})
  assert not t.counted
  with pytest.raises(ValueError, match=r"edge='level' must be 'clients' or 'level<l>'"):
    edge_metrics("level", 1)


def test_the_busiest_edge_of_every_round_is_summed_and_restored():
  """Under a moving membership a round reports ``edge_clients_max``: the busiest edge took in that many
  clients' messages; ``edge_peak_uplink_MB`` sums them over rounds and comes back from a logged row."""
  from fedtree.core.tier import edge_metrics
  from fedtree.toolbox.traffic import Traffic

  def round_(sent, busiest):
    m = {**edge_metrics("clients", sent), "edge_clients_max": busiest}
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in m.items()}

  t = Traffic(100)
  t.add(round_(6, 4))
  t.add(round_(6, 5))
  assert t.summary()["edge_peak_uplink_MB"] * 1e6 == pytest.approx(900.0)
  assert t.summary()["uplink_MB"] * 1e6 == pytest.approx(1200.0)
  back = Traffic(100)
  back.restore(t.row())
  back.add(round_(6, 3))
  assert back.summary()["edge_peak_uplink_MB"] * 1e6 == pytest.approx(1200.0)
  assert "edge_peak_uplink_MB" not in Traffic(100).summary() and "edge_peak_uplink_MB" not in _plain_summary()


def _plain_summary():
  from fedtree.core.tier import edge_metrics
  from fedtree.toolbox.traffic import Traffic

  t = Traffic(100)
  t.add({k: v.item() for k, v in edge_metrics("clients", 3).items()})
  return t.summary()


def test_the_final_table_shows_the_busiest_edge_only_where_a_run_reports_it():
  from fedtree.experiment.reporting import format_summary

  moving = {"accuracy": 0.5, "uplink_MB": 2.0, "downlink_MB": 2.0, "edge_peak_uplink_MB": 1.25}
  fixed = {"accuracy": 0.5, "uplink_MB": 2.0, "downlink_MB": 2.0}
  table = format_summary({"mobile": {"global": moving}, "tree": {"global": fixed}})
  assert "peak edge MB" in table and "1.250" in table
  assert "peak edge MB" not in format_summary({"tree": {"global": fixed}})
