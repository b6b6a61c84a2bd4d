r"""FlowerTune LLM leaderboard, finance challenge: federated instruction tuning on FinGPT's sentiment data,
scored by exact match on FPB, FiQA and TFNS (issue 50).

  python -m fedtree.main --config=configs/llm/flowertune_finance.py --workdir=/tmp/ft_fin \
    --config.model.checkpoint=/models/Mistral-7B-v0.3 --config.data.path=/data/fingpt-sentiment \
    --config.tasks.fpb.path=/data/fpb --config.tasks.fiqa.path=/data/fiqa --config.tasks.tfns.path=/data/tfns

Prepare the training data once where the Hub is reachable (``'flwrlabs/fingpt-sentiment-train',
split='train'``). The three benchmarks are scored in FinGPT's instruction form (columns ``instruction``,
``input``, ``output``: "What is the sentiment of this news? Please choose an answer from {negative/neutral/
positive}.", the sentence, the label word), as FinGPT's benchmark scripts build them from
``takala/financial_phrasebank`` (sentences_50agree), ``pauri32/fiqa-2018`` and
``zeroshot/twitter-financial-news-sentiment``; save each with ``save_to_disk``. A benchmark left without a
path is not scored. The checkpoint is a ``save_pretrained`` folder
(``huggingface-cli download mistralai/Mistral-7B-v0.3 --local-dir /models/Mistral-7B-v0.3``).

The template's published setting: Mistral-7B-v0.3, 50 IID clients (Flower's ``IidPartitioner``), 10 % of
them per round (5), 200 rounds, FedAvg; LoRA r = 32, alpha = 64 on PEFT's default modules for Mistral
(``q_proj``, ``v_proj``); sequences of 512 tokens, the Alpaca prompt as FlowerTune writes it
(``template="flowertune"``: the input appended to the instruction, as its finance challenge does), loss on
the response only; 10 local steps of batch 16, AdamW; a 200,000 MB communication budget. Differences, said
here rather than hidden: the base is int8 (``adapters.base_dtype``; FlowerTune's is 4-bit NF4), and the
learning rate is constant at the template's maximum 5e-5 (its cosine annealing over rounds to 1e-6 is not
modelled: local optimizers restart every round).
"""

import ml_collections

from fedtree.experiment.standard_tasks import flowertune_config, flowertune_task


def get_config() -> ml_collections.ConfigDict:
  tasks = {name: flowertune_task("generation", "alpaca", max_new_tokens=4)   # each its own path and limit
           for name in ("fpb", "fiqa", "tfns")}
  return flowertune_config(
    "'flwrlabs/fingpt-sentiment-train', split='train'",
    num_clients=50,
    cohort_size=5,
    tasks=tasks,
  )
