"""fedtree.core.aggregation: the weighted mean per segment."""

import jax.numpy as jnp
import numpy as np

from fedtree.core.aggregation import weighted_mean


def test_weighted_mean_per_segment_and_empty_segments():
  v = {"w": jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])}
  mean, total = weighted_mean(v, jnp.array([1.0, 3.0, 2.0]), jnp.array([0, 0, 2]), 3)
  np.testing.assert_allclose(mean["w"], [[2.5, 3.5], [0, 0], [5, 6]])
  np.testing.assert_allclose(total, [4, 0, 2])
