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
from ml_collections import config_dict

from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.sweep import default_sweep


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.rounds = 200
  c.eval_every = 200
  c.rounds_per_call = 1
  c.chunk_size = "None"  # the cohort (5 clients) in one vmapped step over the shared base
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
      hub="'flwrlabs/fingpt-sentiment-train', split='train'",
      tokenizer=c.model.get_ref("checkpoint"),
      format="alpaca",
      template="flowertune",
      seq_len=512,
      partitioner="iid",
      partitioner_args=dict(num_clients=50),
      test_fraction=0.01,
      seed=0,
    )
  )
  c.topology = ml_collections.ConfigDict(dict(kind="flat"))
  c.local = ml_collections.ConfigDict(dict(optimizer="adamw", learning_rate=5e-5, batch_size=16, steps=10))
  c.tasks = ml_collections.ConfigDict(
    {
      name: dict(
        kind="generation",
        path=config_dict.placeholder(str),
        format="alpaca",
        template="flowertune",
        seq_len=512,
        max_new_tokens=4,
        limit=config_dict.placeholder(int),
      )
      for name in ("fpb", "fiqa", "tfns")
    }
  )
  c.runs = ml_collections.ConfigDict(
    dict(
      fedavg=dict(
        algorithm="fedavg",
        cohort_size=5,
        adapters=dict(
          kind="lora", rank=32, alpha=64.0, targets=(r"(q_proj|v_proj)/kernel$",), base_dtype="int8"
        ),
      )
    )
  )
  c.mesh_shape = config_dict.placeholder(int)
  c.sweep = default_sweep()
  return declare_runner_fields(c)
