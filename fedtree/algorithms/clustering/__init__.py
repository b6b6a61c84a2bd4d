"""The clustered-FL family (paper 004 and its baselines): the in-jit clustering operations
(:mod:`~fedtree.algorithms.clustering.ops`) and CFL, IFCA, AWCFL and MCFL built on them."""

from fedtree.algorithms.clustering.awcfl import awcfl, check_beta, mix_clusters
from fedtree.algorithms.clustering.cfl import cfl, split_clusters
from fedtree.algorithms.clustering.ifca import cluster_losses, ifca
from fedtree.algorithms.clustering.mcfl import mcfl, select_clusters
from fedtree.algorithms.clustering.ops import (
  ClusterFeatures,
  ClusterState,
  KMeansResult,
  check_num_clusters,
  cluster_accuracy,
  cosine_bipartition,
  cosine_similarity_matrix,
  flatten_rows,
  kmeans,
  kmeans_plusplus,
  match_labels,
  pairwise_distances,
  sample_mean,
  segment_mean_rows,
  squared_distances,
  stable_kmeans,
)

__all__ = [
  "ClusterFeatures", "ClusterState", "KMeansResult", "awcfl", "cfl", "check_beta",
  "check_num_clusters", "cluster_accuracy", "cluster_losses", "cosine_bipartition",
  "cosine_similarity_matrix", "flatten_rows", "ifca", "kmeans", "kmeans_plusplus", "match_labels",
  "mcfl", "mix_clusters", "pairwise_distances", "sample_mean", "segment_mean_rows", "select_clusters",
  "split_clusters", "squared_distances", "stable_kmeans",
]
