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
from ml_collections import config_dict

from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.sweep import default_sweep


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.rounds = 200
  c.eval_every = 200
  c.rounds_per_call = 1
  c.chunk_size = "None"  # the cohort (2 clients) in one vmapped step over the shared base
  c.eval_chunk_size = "4"
  c.progress = True
  c.communication_budget_MB = 200000.0
  c.model = ml_collections.ConfigDict(
    dict(name="pretrained", checkpoint=config_dict.placeholder(str), dtype="bfloat16", remat=True)
  )
  c.data = ml_collections.ConfigDict(
    dict(
      name="instructions",
      path=config_dict.placeholder(str),
      hub="'flwrlabs/alpaca-gpt4', split='train'",
      tokenizer=c.model.get_ref("checkpoint"),
      format="alpaca",
      template="flowertune",
      use_input="drop",
      seq_len=512,
      partitioner="iid",
      partitioner_args=dict(num_clients=20),
      test_fraction=0.01,
      seed=0,
    )
  )
  c.topology = ml_collections.ConfigDict(dict(kind="flat"))
  c.local = ml_collections.ConfigDict(dict(optimizer="adamw", learning_rate=5e-5, batch_size=16, steps=10))
  c.tasks = ml_collections.ConfigDict(
    dict(
      mmlu=dict(
        kind="choice",
        path=config_dict.placeholder(str),
        hub="'cais/mmlu', 'all', split='test'",
        format="mmlu",
        template="raw",
        seq_len=512,
        limit=config_dict.placeholder(int),
      )
    )
  )
  c.runs = ml_collections.ConfigDict(
    dict(
      fedavg=dict(
        algorithm="fedavg",
        cohort_size=2,
        adapters=dict(
          kind="lora", rank=32, alpha=64.0, targets=(r"(q_proj|v_proj)/kernel$",), base_dtype="int8"
        ),
      )
    )
  )
  c.mesh_shape = config_dict.placeholder(int)
  c.sweep = default_sweep()
  return declare_runner_fields(c)
