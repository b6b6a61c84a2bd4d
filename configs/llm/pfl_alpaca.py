r"""pfl-research's LLM benchmark on Alpaca (``benchmarks/llm/configs/alpaca.yaml``): TinyLlama-1.1B, LoRA
r = 8, artificial IID users of Poisson(16) examples, without and with central differential privacy (issue 50).

  python -m fedtree.main --config=configs/llm/pfl_alpaca.py --workdir=/tmp/pfl_alpaca \
    --config.model.checkpoint=/models/TinyLlama-1.1B-intermediate-step-1195k-token-2.5T \
    --config.data.path=/data/alpaca

Prepare Alpaca once where the Hub is reachable (``'tatsu-lab/alpaca', split='train'``). As pfl-research
preprocesses it: Stanford Alpaca's prompt (``template="alpaca"``), the loss on the response and EOS, 512
tokens; users of a Poisson number of examples (mean 16) drawn from the shuffled rows.

The published setting: 1,000 central iterations, cohort 100, Adam on the server (learning rate 0.01 with
50 warm-up iterations and a cosine decay, adaptivity 1e-4: FedAdam with tau = 1e-4), local SGD at 0.01,
batch 4, one epoch; LoRA r = 8, alpha = 8 (PEFT's defaults, on q_proj and v_proj); bf16. The ``dp`` run
adds central DP as pfl-research's (Gaussian, clipping bound 0.1, epsilon 2, delta 1e-6, uniform weights).
Differences: the base is stored in bfloat16 (pfl keeps float32 weights under bfloat16 autocast); the local
gradient clipping at norm 1 (``local_max_grad_norm``) is not applied (fedtree's local optimizer has no
per-step clipping field); pfl samples users as a population of 1e6 with a noise cohort of 5,000, fedtree
accounts DP at the run's own sampling rate (cohort / clients); pfl holds out 10 % of the users as its
validation set, fedtree 10 % of every user's examples (users of one example keep it for training).
"""

import ml_collections
from ml_collections import config_dict

from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.sweep import default_sweep

ADAPTERS = dict(kind="lora", rank=8, alpha=8.0, targets=(r"(q_proj|v_proj)/kernel$",), base_dtype="bfloat16")
SERVER = dict(
  name="fedadam",
  tau=1e-4,
  learning_rate=dict(
    name="warmup_cosine_decay_schedule", init_value=0.0, peak_value=0.01, warmup_steps=50, decay_steps=1000
  ),
)


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.rounds = 1000
  c.eval_every = 100
  c.rounds_per_call = 1
  c.chunk_size = "auto"
  c.eval_chunk_size = "8"
  c.progress = True
  c.model = ml_collections.ConfigDict(
    dict(name="pretrained", checkpoint=config_dict.placeholder(str), dtype="bfloat16", remat=True)
  )
  c.data = ml_collections.ConfigDict(
    dict(
      name="instructions",
      path=config_dict.placeholder(str),
      hub="'tatsu-lab/alpaca', split='train'",
      tokenizer=c.model.get_ref("checkpoint"),
      format="alpaca",
      template="alpaca",
      seq_len=512,
      partitioner="poisson",
      partitioner_args=dict(mean=16),
      test_fraction=0.1,
      seed=0,
    )
  )
  c.topology = ml_collections.ConfigDict(dict(kind="flat"))
  c.local = ml_collections.ConfigDict(dict(optimizer="sgd", learning_rate=0.01, batch_size=4, epochs=1.0))
  c.runs = ml_collections.ConfigDict(
    dict(
      fedavg=dict(algorithm="fedopt", cohort_size=100, server=SERVER, adapters=ADAPTERS),
      dp=dict(
        algorithm="fedopt",
        cohort_size=100,
        server=SERVER,
        adapters=ADAPTERS,
        weighting="uniform",
        privacy=dict(clip_norm=0.1, target_epsilon=2.0, delta=1e-6),
      ),
    )
  )
  c.mesh_shape = config_dict.placeholder(int)
  c.sweep = default_sweep()
  return declare_runner_fields(c)
