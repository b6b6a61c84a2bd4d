"""The clustered-FL family (paper 004 and its baselines): the in-jit clustering operations
(:mod:`~fedtree.algorithms.clustering.ops`), one round with the clustering method and the
inter-cluster strategy as independent choices
(:func:`~fedtree.algorithms.clustering.clustered.clustered`), and CFL, IFCA, AWCFL and MCFL
as named pairs of those choices."""

from fedtree.algorithms.clustering.awcfl import awcfl, check_beta, mix_clusters
from fedtree.algorithms.clustering.cfl import cfl, split_clusters
from fedtree.algorithms.clustering.clustered import CLUSTERINGS, INTER_CLUSTER, clustered
from fedtree.algorithms.clustering.ifca import cluster_losses, ifca
from fedtree.algorithms.clustering.mcfl import mcfl, select_clusters
from fedtree.algorithms.clustering.ops import (
  ClusterFeatures,
  ClusterModels,
  ClusterState,
  KMeansResult,
  check_num_clusters,
  cosine_bipartition,
  cosine_similarity_matrix,
  flatten_rows,
  kmeans,
  kmeans_plusplus,
  match_labels,
  optimal_assignment,
  pairwise_distances,
  sample_mean,
  segment_mean_rows,
  squared_distances,
  stable_kmeans,
)
from fedtree.core.metrics import adjusted_rand_index, cluster_accuracy

__all__ = [
  "CLUSTERINGS", "INTER_CLUSTER", "ClusterFeatures", "ClusterModels", "ClusterState", "KMeansResult",
  "adjusted_rand_index",
  "awcfl", "clustered", "optimal_assignment", "cfl", "check_beta",
  "check_num_clusters", "cluster_accuracy", "cluster_losses", "cosine_bipartition",
  "cosine_similarity_matrix", "flatten_rows", "ifca", "kmeans", "kmeans_plusplus", "match_labels",
  "mcfl", "mix_clusters", "pairwise_distances", "sample_mean", "segment_mean_rows", "select_clusters",
  "split_clusters", "squared_distances", "stable_kmeans",
]
