r"""FlowerTune LLM leaderboard, medical challenge: federated instruction tuning on Medical Meadow's
flashcards, scored by PubMedQA (exact match), MedMCQA and MedQA (multiple choice) (issue 50).

  python -m fedtree.main --config=configs/llm/flowertune_medical.py --workdir=/tmp/ft_med \
    --config.model.checkpoint=/models/Mistral-7B-v0.3 --config.data.path=/data/medical-flashcards \
    --config.tasks.medmcqa.path=/data/medmcqa --config.tasks.medqa.path=/data/medqa

Prepare once where the Hub is reachable: the training data (``'flwrlabs/medical-meadow-medical-flashcards',
split='train'``), MedMCQA (``'openlifescienceai/medmcqa', split='validation'``), MedQA's 4-option
form (``'GBaker/MedQA-USMLE-4-options', split='test'``); PubMedQA in instruction form (``instruction``:
the question and its context, ``output``: yes/no/maybe, from ``'qiaojin/PubMedQA', 'pqa_labeled'``). A
benchmark left without a path is not scored. The checkpoint is a ``save_pretrained`` folder
(``huggingface-cli download mistralai/Mistral-7B-v0.3 --local-dir /models/Mistral-7B-v0.3``).

The template's published setting: Mistral-7B-v0.3, 20 IID clients (Flower's ``IidPartitioner``), 10 % of
them per round (2), 200 rounds, FedAvg; LoRA r = 32, alpha = 64 on PEFT's default modules for Mistral
(``q_proj``, ``v_proj``); sequences of 512 tokens, the Alpaca prompt as FlowerTune writes it
(``template="flowertune"``: the flashcard's question, its ``input``, as the instruction, as its medical
challenge does), loss on the response only; 10 local steps of batch 16, AdamW; a
200,000 MB communication budget. Differences, said here rather than hidden: the base is int8
(``adapters.base_dtype``; FlowerTune's is 4-bit NF4), and the learning rate is constant at the template's
maximum 5e-5 (its cosine annealing over rounds to 1e-6 is not modelled: local optimizers restart every
round).
"""

import ml_collections

from fedtree.experiment.standard_tasks import flowertune_config, flowertune_task


def get_config() -> ml_collections.ConfigDict:
  tasks = dict(
    pubmedqa=flowertune_task("generation", "alpaca", max_new_tokens=3),
    medmcqa=flowertune_task("choice", "medmcqa", hub="'openlifescienceai/medmcqa', split='validation'"),
    medqa=flowertune_task("choice", "medqa", hub="'GBaker/MedQA-USMLE-4-options', split='test'"),
  )
  return flowertune_config(
    "'flwrlabs/medical-meadow-medical-flashcards', split='train'",
    num_clients=20,
    cohort_size=2,
    use_input="as_instruction",
    tasks=tasks,
  )
