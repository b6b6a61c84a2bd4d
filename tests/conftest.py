"""Test-wide settings: rank promotion raises (as in flax's tests) and tests stay on CPU.

Tests measured at about 15 s or more in the default run (``--durations``, 2 xdist workers on
the 2-core CI machine, 2026-11-23) are marked ``slow`` here by node id, so the default run
stays short; ``pytest -m slow`` (``FEDTREE_CI_SLOW=1 bash .ci/run``) runs them. The quickstart
notebook, FedAvg against its per-client loop and the quickstart end to end stay in the
default run.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The tests compile hundreds of tiny programs, and XLA:CPU's LLVM optimizations are most of
# that time while buying nothing at these sizes (tests/test_conformance.py: 2 min 50 s of CPU
# -> 2 min 3 s, same results). Set before JAX starts its backend; FEDTREE_TEST_XLA_OPT=1 keeps
# XLA's default optimization (what a user's run compiles with).
if os.environ.get("FEDTREE_TEST_XLA_OPT", "0") != "1":
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
                             " --xla_llvm_disable_expensive_passes=true").strip()

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

MEASURED_SLOW = {  # each ran 15-87 s (the paper notebooks 18-80 s; the quickstart's stays)
  # measured 15-57 s in the default run on 2026-11-26 (2 workers, the CPU shared), each with a faster
  # sibling: the configs' own tests (privacy, baselines, robust), the LSTM's forward, per-client
  # loops on one server (SCAFFOLD, a personal head), the other shrunk benchmarks
  "tests/test_notebooks.py::test_notebook_runs[privacy.ipynb]",
  "tests/test_notebooks.py::test_notebook_runs[baselines.ipynb]",
  "tests/test_notebooks.py::test_notebook_runs[robust.ipynb]",
  "tests/test_benchmarks.py::test_privacy_benchmark_runs",
  "tests/test_seams.py::test_head_shared_within_each_edge_matches_a_per_client_loop",
  "tests/test_scaffold.py::test_scaffold_on_a_tree_keeps_variates_at_the_clients_parents",
  "tests/test_standard_tasks.py::test_a_benchmark_runs_shrunk_on_files_of_its_schema[afo_shakespeare]",
  "tests/test_lora.py::test_factored_and_merged_forwards_agree[transformer]",
  "tests/test_notebooks.py::test_notebook_runs[000_group_personalization.ipynb]",
  "tests/test_notebooks.py::test_notebook_runs[001_bidirectional_hierarchical_fl.ipynb]",
  "tests/test_notebooks.py::test_notebook_runs[002_keyword_spotting.ipynb]",
  "tests/test_notebooks.py::test_notebook_runs[003_multi_tier_moreau.ipynb]",
  "tests/test_notebooks.py::test_notebook_runs[004_clustered_fl.ipynb]",
  "tests/test_notebooks.py::test_notebook_runs[005_throughput_vs_pytorch.ipynb]",
  "tests/test_notebooks.py::test_notebook_runs[compression.ipynb]",
  "tests/test_notebooks.py::test_notebook_runs[peft_lm.ipynb]",
  # 2026-12-07: the tuning notebook's smoke run, 25-30 s (its pieces: tests/test_search.py)
  "tests/test_notebooks.py::test_notebook_runs[tuning.ipynb]",
  "tests/test_notebooks.py::test_notebook_runs[llm_finetune.ipynb]",   # writes a checkpoint with transformers
  "tests/test_notebooks.py::test_notebook_runs[personalized.ipynb]",   # 43 s (three runs, two seeds)
  "tests/test_lm.py::test_lm_vectorized_over_clients[lstm_lm-kw0-344]",
  "tests/test_kws_models.py::test_a_few_sgd_steps_lower_the_loss[resnet15]",
  "tests/test_bhfl.py::test_level_table_scores_every_node_on_its_subtree_and_on_the_central_set",
  "tests/test_sweep.py::test_sweep_rows_keep_ints_and_tensorboard_runs_per_experiment",
  "tests/test_sweep.py::test_a_diverging_experiment_is_named_by_setting_and_seed",
  "tests/test_asynchrony.py::test_async_bhfl_is_deterministic_for_a_seed",
  "tests/test_benchmarks.py::test_tree_and_scale_modes_run",
  "tests/test_bhfl.py::test_sync_matches_per_node_loop_with_everything_on",
  "tests/test_tier.py::test_fedavg_chunked_equals_unchunked[7]",
  "tests/test_tier.py::test_fedavg_chunked_equals_unchunked[None]",
  "tests/test_tier.py::test_hierfavg_chunked_equals_unchunked",
  "tests/test_clustering.py::test_awcfl_ifca_beta0_is_ifca_and_beta_mixes_ifca_clusters",
  "tests/test_clustering.py::test_cfl_matches_reference_and_splits_flipped_clients",
  "tests/test_clustering.py::test_clustered_config_end_to_end",
  "tests/test_clustering.py::test_composed_runs_from_a_config",
  "tests/test_clustering.py::test_ifca_matches_reference_and_picks_min_loss",
  "tests/test_clustering.py::test_mcfl_is_awcfl_beta0_and_picks_the_nearest_cluster_feature",
  "tests/test_conformance.py::test_fedprox_clients_learn_under_bhfl",
  "tests/test_core_algorithms.py::test_fedadam_matches_paper_equations_per_client",
  "tests/test_core_algorithms.py::test_hierfavg_matches_per_client_loop[sizes0-periods0]",
  "tests/test_core_algorithms.py::test_hierfavg_matches_per_client_loop[sizes1-periods1]",
  "tests/test_core_algorithms.py::test_hierfavg_one_group_period_one_is_fedavg",
  "tests/test_core_algorithms.py::test_same_seed_same_result_other_seed_other_cohort",
  "tests/test_experiment.py::test_a_stopped_run_resumes_from_its_checkpoint",
  "tests/test_experiment.py::test_main_cpu_devices_shards_the_clients",
  "tests/test_experiment.py::test_main_flag_overrides",
  "tests/test_fedkws.py::test_fedkws_config_fedkws_ui_run",
  "tests/test_fedkws.py::test_fedkws_config_on_a_speech_commands_directory",
  "tests/test_fuzz.py::test_fuzz_small",
  "tests/test_grouppfl.py::test_group_personalized_config_accepts_a_tfds_dataset",
  "tests/test_grouppfl.py::test_group_personalized_config_end_to_end",
  "tests/test_grouppfl.py::test_group_stage_with_no_rounds_changes_nothing",
  "tests/test_kws_models.py::test_vmapped_over_clients[resnet15]",
  "tests/test_lm.py::test_char_embedding_and_errors",
  "tests/test_lm.py::test_group_personalized_lm_text_dir_end_to_end",
  "tests/test_lm.py::test_lm_vectorized_over_clients[transformer_lm-kw1-None]",
  "tests/test_multi_configs.py::test_bhfl_config_one_combined_run",
  "tests/test_multi_configs.py::test_pfedmt_mnist_config_runs_on_mocked_tfds[cnn]",
  "tests/test_multi_configs.py::test_pfedmt_mnist_config_runs_on_mocked_tfds[mlr]",
  "tests/test_multi_configs.py::test_pfedmt_synthetic_config_end_to_end[dnn]",
  "tests/test_multi_configs.py::test_pfedmt_synthetic_config_end_to_end[mlr]",
  "tests/test_objectives.py::test_fedprox_mu0_is_fedavg",
  "tests/test_personalization_config.py::test_personalization_config_end_to_end",
  "tests/test_pfedmt.py::test_reproduction_options_match_per_device_loop[opts4]",
  "tests/test_ragged.py::test_config_layout_ragged_gives_the_padded_results",
  "tests/test_resume.py::test_a_corrupted_latest_checkpoint_falls_back_to_the_previous_one",
  "tests/test_resume.py::test_a_workdir_of_another_config_is_refused_unless_overwrite",
  "tests/test_cli.py::test_cli_refusal_is_one_line_and_results_go_to_stdout",
  "tests/test_resume.py::test_resumed_rows_are_not_duplicated_in_process",
  "tests/test_resume.py::test_sigkill_between_checkpoints_resumes_bit_equal_without_duplicate_rows",
  "tests/test_resume.py::test_stopped_and_resumed_run_equals_an_uninterrupted_one[pfedme]",
  "tests/test_sharding.py::test_config_fields_mesh_auto_chunk_and_bf16",
  "tests/test_sharding.py::test_eight_fake_devices_match_one_device",
  "tests/test_sweep.py::test_awcfl_beta_sweep_equals_separate_runs",
  "tests/test_sweep.py::test_hyperparameter_sweep_equals_separate_runs[fedavg-local.learning_rate=0.02,0.1]",
  "tests/test_sweep.py::test_runner_table_rows_summary_and_resume",
  "tests/test_sweep.py::test_seeds_equal_separate_runs[fedavg]",
  # measured 17-41 s in the merged suite (2026-11-24); each keeps a faster sibling in the default run
  "tests/test_arrays_data.py::test_cli_reads_the_arrays_and_reports_fairness",
  "tests/test_lora.py::test_zero_b_equals_base_and_merge_gives_the_same_logits[transformer]",
  "tests/test_signals.py::test_a_stop_before_the_first_checkpoint_writes_one_and_resumes_from_it",
  "tests/test_updates.py::test_blockwise_aggregator_sees_each_parents_cohort[3]",
  "tests/test_sampling_strategies.py::test_hierfavg_strategies_and_bad_input",
  "tests/test_updates.py::test_identity_path_is_bitwise_today_for_every_algorithm[cfl]",
  "tests/test_updates.py::test_identity_path_is_bitwise_today_for_every_algorithm[bhfl]",
  "tests/test_clustering.py::test_split_separation_check_by_hand",
  "tests/test_core_algorithms.py::test_fedavg_is_sgd_one_on_the_pseudo_gradient",
  "tests/test_clustering.py::test_awcfl_one_cluster_beta0_is_fedavg",
  # measured 10-31 s in the default run of 2026-11-26 (2 workers, a load of 6-9; 25 min 32 s in all),
  # each with a sibling left in the default run (another parametrization of the same test, the
  # method's per-client reference test, or the report's own tests)
  "tests/test_bhfl.py::test_level_report_reuses_the_runs_evaluation_of_the_levels",
  "tests/test_bhfl.py::test_reduces_to_hierfavg[None-periods0]",
  "tests/test_bhfl.py::test_async_matches_per_node_loop[cohort0-buffers0]",
  "tests/test_mime.py::test_without_momentum_mimelite_is_fedavg_and_so_is_mime_with_one_full_batch_step",
  "tests/test_fedbuff.py::test_deadline_matches_an_event_loop[True]",
  "tests/test_scaffold.py::test_scaffold_matches_algorithm_1_per_client[II-all-1.0]",
  "tests/test_pfedmt.py::test_reproduction_options_match_per_device_loop[opts0]",
  "tests/test_pfedmt.py::test_vectorized_matches_per_device_loop[examples-None]",
  "tests/test_docs.py::test_docstring_examples_run[fedtree.algorithms.hierarchical.grouppfl.grouppfl]",
  "tests/test_conformance.py::test_conformance[pfedhn]",
  "tests/test_pairwise_configs.py::test_on_the_configs_tree_every_client_is_paired_within_its_parent[pfedhn]",
  "tests/test_fednova.py::test_fednova_matches_the_papers_update_per_client[population-examples-0.9-True]",
  "tests/test_ragged.py::test_ragged_batches_and_training_equal_padded[True]",
  "tests/test_ragged.py::test_training_on_the_ragged_layout_equals_padded[shuffled]",
  "tests/test_clustering.py::test_mcfl_cfl_picks_its_own_clusters_model_on_separated_data",
  "tests/test_sweep.py::test_a_one_seed_table_has_no_spread_and_a_model_that_never_trained_is_left_out",
  "tests/test_grouppfl.py::test_group_stage_does_not_depend_on_chunking",
  "tests/test_fedbuff.py::test_tree_is_hierfavg_when_every_slot_reports",
  "tests/test_feddyn.py::test_alpha_zero_is_fedavg_every_round",
  "tests/test_sharding.py::test_one_device_mesh_is_transparent",
  "tests/test_benchmarks.py::test_methods_benchmark_reports_ratios_to_fedavg",
  # measured 15-56 s in the default run of 2026-12-06 (2 workers), which grew to 29.5 min; each has a
  # sibling that stays: the streamed resident-equivalence and paged tests, the sharding tests on eight
  # devices, AFL's per-client loops, the other swept floats, the fused-round byte counts, FedFomo's
  # per-client loop
  "tests/test_population_run.py::test_a_streamed_run_resumes_its_paged_state",
  "tests/test_sharding.py::test_privacy_noise_on_eight_devices_matches_one_device",
  "tests/test_afl.py::test_afl_reports_the_average_of_its_iterates",
  "tests/test_baseline_sweeps.py::test_swept_floats_equal_the_runs_alone[qffl-values0-extra0]",
  "tests/test_population_run.py::test_streamed_and_resident_runs_print_the_same_table",
  "tests/test_traffic.py::test_a_resumed_finished_run_reports_its_bytes",
  "tests/test_fedfomo.py::test_a_separate_validation_split_is_the_held_out_one_when_they_agree",
  # measured 2.5-12 s in the default run of 2026-12-07 (2 workers; the run on the CI machine took
  # 30.1 min, over its bar): every parametrization of a test but its cheapest (Mime's reference stays,
  # MimeLite's moves), and single tests each beside a sibling that stays (the population stream's stop,
  # the calibration tests, the batched adapters, the per-client references of pFedHN, FedProto, Mime,
  # the throughput benchmark's test, the other batch-order tests, LoRA's factored forward)
  "tests/test_scaffold.py::test_scaffold_matches_algorithm_1_per_client[I-all-1.0]",
  "tests/test_window.py::test_a_round_over_a_window_is_the_round_over_the_population[scaffold]",
  "tests/test_population_stream.py::test_a_streamed_run_is_the_resident_run[fedavg-2-2]",
  "tests/test_window.py::test_a_round_over_a_window_is_the_round_over_the_population[ditto]",
  "tests/test_distributed_dp.py::test_decoded_noise_of_zero_updates_has_the_calibrated_variance[ddg]",
  "tests/test_window.py::test_a_round_over_a_window_is_the_round_over_the_population[hierfavg]",
  "tests/test_fuzz_sections.py::test_the_combinations_found_crashing_build_and_trace[attack_systems_lora]",
  "tests/test_pfedmt.py::test_reproduction_options_match_per_device_loop[opts1]",
  "tests/test_window.py::test_a_round_over_a_window_is_the_round_over_the_population[fedper]",
  "tests/test_standard_models.py::test_a_cohort_vmapped_equals_each_client_alone[fedavg_cnn]",
  "tests/test_updates.py::test_identity_path_is_bitwise_today_for_every_algorithm[pfedmt]",
  "tests/test_privacy.py::test_every_algorithm_runs_with_privacy_on[hierfavg]",
  "tests/test_objectives.py::test_perfedavg_update_matches_reference[hf]",
  "tests/test_window.py::test_a_round_over_a_window_is_the_round_over_the_population[power_of_choice]",
  "tests/test_privacy.py::test_clipping_against_a_per_client_loop[False-count]",
  "tests/test_refusals.py::test_a_refused_run_leaves_the_workdir_as_it_was[multi-krum f above the cohort]",
  "tests/test_standard_models.py::test_a_cohort_vmapped_equals_each_client_alone[flgo_cnn]",
  "tests/test_window.py::test_a_round_over_a_window_is_the_round_over_the_population[error_feedback]",
  "tests/test_standard_models.py::test_a_cohort_vmapped_equals_each_client_alone[stackoverflow_lstm]",
  "tests/test_traffic.py::test_every_edge_of_a_three_level_tree_by_hand[True]",
  "tests/test_pfedmt.py::test_one_device_per_team_by_hand[sizes1-examples]",
  "tests/test_updates.py::test_identity_path_is_bitwise_today_for_every_algorithm[fedavg]",
  "tests/test_seams.py::test_methods_run_poisson_sampling_and_systems_from_the_host[pfedme-fields1]",
  "tests/test_privacy.py::test_every_algorithm_runs_with_privacy_on[fedavg]",
  "tests/test_batch_order.py::test_fedavg_by_hand[fixed]",
  "tests/test_refusals.py::test_a_refused_run_leaves_the_workdir_as_it_was[swept top-k fraction]",
  "tests/test_pfedmt.py::test_reproduction_options_match_per_device_loop[opts3]",
  "tests/test_mime.py::test_mime_matches_algorithm_1_per_client[mimelite-uniform-0.7]",
  "tests/test_signals.py::test_a_stop_inside_a_call_of_fused_rounds_ends_it_after_the_round_in_progress",
  "tests/test_privacy.py::test_a_swept_target_epsilon_is_a_calibrated_noise_multiplier_per_setting",
  "tests/test_llm_cohort.py::test_every_clients_step_runs_through_one_base",
  "tests/test_dtype.py::test_float64_state_of_cfl_whose_cluster_count_crashed_under_x64",
  "tests/test_privacy_tree.py::test_hierfavg_round_noise_at_the_root_vs_the_edges[0]",
  "tests/test_refusal_wording.py::test_an_explicit_mean_aggregator_is_the_weighted_mean_every_method_takes",
  "tests/test_objectives.py::test_hessian_free_differs_from_first_order",
  "tests/test_benchmarks.py::test_secure_benchmark_reports_overheads_against_the_plain_round",
  "tests/test_benchmarks.py::test_llm_benchmark_model_flops_and_the_fedtree_worker",
  "tests/test_mime.py::test_bytes_count_the_gradient_the_statistics_and_the_variate",
  "tests/test_batch_order.py::test_cyclic_visits_every_example_once_per_pass_and_resumes_across_rounds",
  "tests/test_batch_order.py::test_fixed_is_identical_across_rounds_and_shuffled_is_not",
  "tests/test_pretrained.py::test_remat",
  "tests/test_pfedhn.py::test_pfedhn_pc_keeps_each_clients_head",
  "tests/test_pfedhn.py::test_pfedhn_starts_from_given_values_and_flgos_embedding_step",
  "tests/test_lora.py::test_the_base_is_an_argument_of_the_round_not_a_constant",
  "tests/test_fedproto.py::test_no_prototype_term_is_local_training",
  "tests/test_benchmarks_gpu_session.py::test_methods_benchmark_hands_over_every_turn_but_the_last",
  "tests/test_heterogeneous.py::test_the_masked_tier_is_the_per_client_loop_of_sliced_sub_models[fedrolex-rolling]",
  "tests/test_heterogeneous.py::test_a_masked_cnn_computes_what_its_sliced_cnn_computes[0]",   # [5] stays
  "tests/test_heterogeneous.py::test_label_split_cuts_each_clients_output_layer_to_its_classes",
}


def pytest_collection_modifyitems(config, items):
  for item in items:
    if item.nodeid in MEASURED_SLOW:
      item.add_marker(pytest.mark.slow)


def pytest_sessionfinish(session, exitstatus):
  """A pytest-xdist worker whose execution is still going 5 s after the controller shut its
  gateway down is sent a SIGINT by execnet (``gateway_base._terminate_execution``); landing in
  JAX's garbage-collection callback, that KeyboardInterrupt printed "Exception ignored in:
  <function _xla_gc_callback> ... KeyboardInterrupt" at the end of some runs. The tests are done
  here, so XLA's callback has nothing left to do: it is removed."""
  import gc

  gc.callbacks[:] = [cb for cb in gc.callbacks if getattr(cb, "__name__", "") != "_xla_gc_callback"]
