r"""FlowerTune LLM leaderboard, code challenge: federated instruction tuning on CodeAlpaca-20k (issue 50).

  python -m fedtree.main --config=configs/llm/flowertune_code.py --workdir=/tmp/ft_code \
    --config.model.checkpoint=/models/Mistral-7B-v0.3 --config.data.path=/data/code-alpaca-20k

Prepare the training data once where the Hub is reachable (``'flwrlabs/code-alpaca-20k', split='train'``).
The leaderboard scores this challenge by HumanEval and MBPP pass@1, which executes the generated
programs: fedtree does not run generated code, so this config reports the held-out clients' perplexity
(every client keeps 1 % of its examples) and no pass@1; score the saved adapters with the leaderboard's
own harness. The checkpoint is a ``save_pretrained`` folder
(``huggingface-cli download mistralai/Mistral-7B-v0.3 --local-dir /models/Mistral-7B-v0.3``).

The template's published setting: Mistral-7B-v0.3, 10 IID clients (Flower's ``IidPartitioner``), 10 % of
them per round (20 %, 2: the code challenge's fraction), 200 rounds, FedAvg; LoRA r = 32, alpha = 64 on
PEFT's default modules for Mistral (``q_proj``, ``v_proj``); sequences of 512 tokens, the Alpaca prompt as
FlowerTune writes it (``template="flowertune"``: the input appended to the instruction, as its code
challenge does), loss on the response only; 10 local steps of batch 16, AdamW; a 200,000 MB communication
budget. Differences, said here rather than hidden: the base is int8 (``adapters.base_dtype``; FlowerTune's
is 4-bit NF4), and the learning rate is constant at the template's maximum 5e-5 (its cosine annealing over
rounds to 1e-6 is not modelled: local optimizers restart every round).
"""

import ml_collections

from fedtree.experiment.standard_tasks import flowertune_config


def get_config() -> ml_collections.ConfigDict:
  return flowertune_config(
    "'flwrlabs/code-alpaca-20k', split='train'",
    num_clients=10,
    cohort_size=2,
  )
