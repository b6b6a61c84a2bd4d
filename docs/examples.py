# The names every docstring example may assume (tests/test_docs.py runs each example in them).
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.core import loop
from fedtree.core.local import LocalSchedule
from fedtree.core.topology import Topology
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.models import build_model

data, groups = grouped_synthetic(group_sizes=(3, 2), dim=8, num_classes=3)   # 5 clients in 2 groups
model = build_model("logreg", example_shape=data.example_shape, num_classes=3)
