"""Datasets: generated ones (no download), TFDS, and raw-directory loaders, each a function
returning :class:`~fedtree.core.data.FederatedData` (``config.data`` is read by
:mod:`fedtree.experiment.data`)."""

from fedtree.datasets.digits import sklearn_digits
from fedtree.datasets.prototypes import prototype_images
from fedtree.datasets.speech_commands import load_speech_commands
from fedtree.datasets.synthetic import grouped_synthetic, synthetic_alpha_beta
from fedtree.datasets.synthetic_kws import synthetic_kws
from fedtree.datasets.tfds_loader import load_tfds
from fedtree.datasets.transforms import transform_random_clients

__all__ = [
  "grouped_synthetic", "load_speech_commands", "load_tfds", "prototype_images", "sklearn_digits",
  "synthetic_alpha_beta", "synthetic_kws", "transform_random_clients",
]
