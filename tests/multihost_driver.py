"""One process of tests/test_multihost.py: FedAvg on a tiny problem with the clients sharded
over every device of every process (``jax.distributed`` on the CPU backend).

  python tests/multihost_driver.py NUM_PROCESSES PROCESS_ID PORT OUT.npz

``NUM_PROCESSES=1`` runs the same problem in one process, unsharded (the reference).
"""

import sys


def main(argv):
  num_processes, process_id, port, out = int(argv[1]), int(argv[2]), int(argv[3]), argv[4]
  import jax

  if num_processes > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                               num_processes=num_processes, process_id=process_id)
  import contextlib

  import numpy as np
  import optax

  from fedtree.algorithms import fedavg
  from fedtree.core import loop
  from fedtree.core.data import as_device
  from fedtree.core.local import LocalSchedule
  from fedtree.core.sharding import client_mesh, shard_data
  from fedtree.datasets.synthetic import grouped_synthetic
  from fedtree.models import build_model

  data, _ = grouped_synthetic(group_sizes=(4, 4), dim=6, num_classes=3, mean_examples=8,
                              min_examples=4, max_examples=12, test_examples=4, seed=0)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,))
  alg = fedavg(model=model, data=data, local_optimizer=optax.sgd(0.1),
               schedule=LocalSchedule(batch_size=4, epochs=1), cohort_size=4, chunk_size=4)
  mesh = client_mesh() if num_processes > 1 else None
  data = shard_data(data, mesh) if mesh is not None else as_device(data)
  with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
    state = loop.run(alg, data, num_rounds=3, key=jax.random.key(0), rounds_per_call=3)
    leaves = [np.asarray(jax.device_get(x)) for x in jax.tree.leaves(state.params[0])]
  if process_id == 0:
    np.savez(out, *leaves)
  print(f"process {process_id}: {len(jax.devices())} devices, {jax.process_count()} processes")


if __name__ == "__main__":
  main(sys.argv)
