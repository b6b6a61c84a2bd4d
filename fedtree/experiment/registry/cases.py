"""The smallest run config of every registered algorithm: its required fields, short warm-ups
(:data:`SMALLEST`). The composition matrix (:mod:`fedtree.experiment.compositions`) probes every
capability on these runs; the tests' conformance, fuzz and several-process runs start from them."""

SMALLEST: dict[str, dict] = {
  "fedavg": {}, "fedopt": {"server": {"name": "fedadam", "learning_rate": 0.01}},
  "hierfavg": {"periods": (2,)}, "fedprox": {"mu": 0.1}, "ditto": {"lam": 0.5},
  "pfedme": {"lam": 5.0, "inner_steps": 2, "personal_lr": 0.05},
  "perfedavg": {"alpha": 0.05, "beta": 0.05}, "pfedmt": {"team_iters": 2},
  "bhfl": {"eta_down": 0.5, "cohort_size": 2}, "cfl": {"max_clusters": 2, "eps1": 5.0, "eps2": 0.01},
  "ifca": {"num_clusters": 2}, "awcfl": {"num_clusters": 2, "cluster_start_round": 1},
  "mcfl": {"num_clusters": 2, "cluster_start_round": 1, "feature_examples": 3},
  "fedkws": {"cohort_size": 4}, "fedmmd": {"lam": 0.01}, "fedbuff": {"buffer_size": 2, "concurrency": 3},
  # two rounds of each stage: a 4-round run crosses the boundary, a resume after 2 starts on it
  "grouppfl": {"global_rounds": 2, "group_rounds": 2},
  "scaffold": {"cohort_size": 4},
  "feddyn": {"alpha": 0.1, "cohort_size": 4}, "fednova": {"cohort_size": 4},
  "fedex": {"cohort_size": 4, "lr_scales": (0.5, 1.0, 2.0)},
  "mime": {"cohort_size": 4}, "mimelite": {"cohort_size": 4},
  "moon": {"mu": 1.0, "cohort_size": 4}, "qffl": {"q": 1.0, "cohort_size": 4},
  "afl": {"domain_learning_rate": 0.1, "cohort_size": 4}, "fedasync": {"concurrency": 3},
  # partial personalization (issue 37); FedBN's run has the MLP with BatchNorm (the run's own model)
  "fedper": {}, "fedrep": {"head_steps": 2}, "lgfedavg": {}, "fedbn": {"model": {"norm": "batch"}},
  "fedrod": {}, "fedbabu": {"finetune_epochs": 0, "finetune_steps": 2}, "local": {},
  "apfl": {"cohort_size": 4}, "fedala": {"cohort_size": 4, "max_ala_epochs": 12},
  "fedem": {"num_components": 2}, "knnper": {"k": 3},
  "fedamp": {"attention": "cosine"}, "fedfomo": {"num_candidates": 1},
  "pfedhn": {"hidden": 8, "cohort_size": 2}, "fedproto": {"lam": 1.0},
  # methods on LoRA adapters (issue 50): their runs need an adapters section
  "ffa_lora": {"adapters": {"rank": 2}}, "fedsa_lora": {"adapters": {"rank": 2}},
  "hetlora": {"adapters": {"rank": 2}, "ranks": (1, 2)},
  # clients of different widths (issue 51)
  "heterofl": {"rates": (1.0, 0.5)}, "fedrolex": {"rates": (1.0, 0.5)},
  "fjord": {"rates": (0.5, 1.0)},
  "feddf": {"public_examples": 16, "distill_steps": 3, "distill_batch_size": 4},
  "fedmd": {"public_examples": 16, "public_subset": 6, "digest_steps": 2}, "depthfl": {},
}
