"""One Hugging Face Trainer run for test_trainer.py, as a user would write it: remat is on only through
REMAT_BUDGET and `import remat` at the top (nothing else changes). Trains a small GPT-2 5 steps on a synthetic
dataset, saves a checkpoint at step 5, and writes the logged losses and remat's stats to OUT/run.json.

    python trainer_worker.py OUT
"""

import json
import os
import sys

if os.environ.get("REMAT_BUDGET"):
    import remat  # the one line: REMAT_BUDGET turns remat on for the whole process

import torch
import transformers

out = sys.argv[1]
torch.manual_seed(0)
model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128,
                                                              n_positions=64))
ids = torch.randint(0, 128, (40, 64), generator=torch.Generator().manual_seed(1))
dataset = [{"input_ids": row, "labels": row} for row in ids]
args = transformers.TrainingArguments(output_dir=out, max_steps=5, per_device_train_batch_size=4, logging_steps=1,
                                      save_strategy="steps", save_steps=5, report_to=[], use_cpu=True, seed=3,
                                      dataloader_num_workers=0, disable_tqdm=True)
trainer = transformers.Trainer(model=model, args=args, train_dataset=dataset)
trainer.train()
result = {"losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]}
if os.environ.get("REMAT_BUDGET"):
    result["stats"] = {k: v for k, v in remat.stats().items() if isinstance(v, (int, float))}
with open(os.path.join(out, "run.json"), "w") as f:
    json.dump(result, f)
