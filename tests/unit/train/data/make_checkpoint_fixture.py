"""Writes tests/unit/train/data/checkpoint-written-before-learner-state-dict.pt with Checkpointer.save: a tiny
learner with SGD momentum, an EMA and an fp16 loss scaler, two steps in. Usage: make_checkpoint_fixture.py RUN_DIR"""
import sys
from pathlib import Path
import torch
from ddp_train.checkpoint import Checkpointer, Progress
from ddp_train.config import TrainConfig
from ddp_train.distributed import DistEnv
from ddp_train.recipe.learner import build_learner, update_ema
from ddp_train.resolve import resolve

run_dir = Path(sys.argv[1])
config = TrainConfig(width_scale=1 / 32, batch_size=8, ema_decay=0.5, precision="fp16", run_dir=str(run_dir),
                     epochs=3, seed=7)
cpu = torch.device("cpu")
learner = build_learner(resolve(config, "cpu", 1, gpu_bf16=False, cpu_bf16=None), 0, cpu)
torch.manual_seed(1)
x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 100, (8,))
for _ in range(2):
    loss = learner.criterion(learner.model(x), y)
    learner.scaler.scale(loss).backward()
    learner.scaler.step(learner.optimizer)
    learner.scaler.update()
    learner.optimizer.zero_grad(set_to_none=True)
    update_ema(learner.ema, learner.model, config.ema_decay)
progress = Progress(epoch=1, step=2, accuracies=[0.25], best_accuracy=0.25, train_time_s=1.5, images=16)
Checkpointer(config, learner, DistEnv(0, 1, 0, 1), cpu).save(progress)
