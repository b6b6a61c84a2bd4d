r"""FlowerTune LLM leaderboard, general NLP challenge (Flower's ``flowertune-llm`` template): federated
instruction tuning of a pretrained model on Alpaca-GPT4, scored by MMLU (issue 50).

  python -m fedtree.main --config=configs/llm/flowertune_general_nlp.py --workdir=/tmp/ft_nlp \
    --config.model.checkpoint=/models/Mistral-7B-v0.3 --config.data.path=/data/alpaca-gpt4 \
    --config.tasks.mmlu.path=/data/mmlu

Data cannot be downloaded by fedtree: prepare each once where the Hub is reachable (the refusal of a
missing path prints the command), e.g. ``python -c "import datasets; datasets.load_dataset(
'flwrlabs/alpaca-gpt4', split='train').save_to_disk('/data/alpaca-gpt4')"``, and MMLU's test split
(``'cais/mmlu', 'all', split='test'``). The checkpoint is a ``save_pretrained`` folder
(``huggingface-cli download mistralai/Mistral-7B-v0.3 --local-dir /models/Mistral-7B-v0.3``).

The template's published setting: Mistral-7B-v0.3, 20 IID clients (Flower's ``IidPartitioner``), 10 % of
them per round (2), 200 rounds, FedAvg; LoRA r = 32, alpha = 64 on PEFT's default modules for Mistral
(``q_proj``, ``v_proj``); sequences of 512 tokens, the Alpaca prompt as FlowerTune writes it
(``template="flowertune"``: the instruction alone, as its general NLP challenge formats it), loss on the
response only; 10 local steps of batch 16, AdamW; a
200,000 MB communication budget. Differences, said here rather than hidden: the base is int8
(``adapters.base_dtype``; FlowerTune's is 4-bit NF4), and the learning rate is constant at the template's
maximum 5e-5 (its cosine annealing over rounds to 1e-6 is not modelled: local optimizers restart every
round).
"""

import ml_collections

from fedtree.experiment.standard_tasks import flowertune_config, flowertune_task


def get_config() -> ml_collections.ConfigDict:
  tasks = dict(mmlu=flowertune_task("choice", "mmlu", hub="'cais/mmlu', 'all', split='test'"))
  return flowertune_config(
    "'flwrlabs/alpaca-gpt4', split='train'",
    num_clients=20,
    cohort_size=2,
    use_input="drop",
    tasks=tasks,
  )
