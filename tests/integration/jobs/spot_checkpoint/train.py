"""Managed spot training script (tests/integration/test_spot.py, bench/spot_interruption_bench.py):
a small deterministic torch model trained step by step, checkpointed into /opt/ml/checkpoints so
that an interrupted run resumes exactly where it was and ends with the same weights, bit for bit,
as a run that was never interrupted (training-contract.md §9).

Run by Kiln's training toolkit in script mode (`python3 train.py --epochs 16 --seed 7 ...`, the
SageMaker SDK's PyTorch estimator or a raw CreateTrainingJob with sagemaker_program). Arguments:

  --epochs N          epochs (default 16)
  --seed S            seeds the data, the initial weights and the dropout RNG (default 7)
  --step-seconds T    sleep after every optimizer step (default 0.06; 8 steps an epoch, so ~0.5 s)
  --checkpoint-dir D  default /opt/ml/checkpoints (CheckpointConfig.LocalPath)

What it prints (the tests match these lines):

  spot_checkpoint: process started pid=<pid>                      first line, before torch is imported
  spot_checkpoint: no checkpoint in <dir>, starting at epoch=0 step=0
  spot_checkpoint: resumed from <file> at epoch=<e> step=<s> attempt=<n>
  epoch=<e> loss=<value>                                          once per epoch, across attempts
  spot_checkpoint: SIGTERM, checkpoint saved at epoch=<e> step=<s>
  spot_checkpoint: done, model saved (<steps> steps)

The state saved (after every epoch and, on SIGTERM, after the step in progress): model and Adam
state dicts, the next (epoch, step), the epoch's running loss, the torch RNG state (dropout draws
from it) and the attempt count. Each epoch's batch order comes from a generator seeded with
(seed, epoch), so it needs no saving. One thread, so that reductions run in the same order in
every process. The file is written to a temporary name and renamed, so Kiln's checkpoint sync
never uploads half a file.
"""
import os
import signal
import sys
import time

print("spot_checkpoint: process started pid=%d" % os.getpid(), flush=True)

# SIGTERM (interruption, stop, MaxWaitTime) only sets a flag: the step in progress finishes, the
# state after it is saved, and the program exits 0. Installed before torch is imported, so even a
# SIGTERM during start-up leaves a consistent checkpoint.
TERM = {"requested": False}
signal.signal(signal.SIGTERM, lambda *_: TERM.__setitem__("requested", True))

import argparse  # noqa: E402

import torch  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=16)
parser.add_argument("--seed", type=int, default=7)
parser.add_argument("--step-seconds", "--step_seconds", dest="step_seconds", type=float, default=0.06)
parser.add_argument("--checkpoint-dir", "--checkpoint_dir", dest="checkpoint_dir", default="/opt/ml/checkpoints")
args, _unknown = parser.parse_known_args()

torch.set_num_threads(1)
ROWS, FEATURES, BATCH = 256, 8, 32
STEPS = ROWS // BATCH
CKPT = os.path.join(args.checkpoint_dir, "checkpoint.pt")

# The data: a fixed function of the seed.
g = torch.Generator().manual_seed(args.seed)
x = torch.randn(ROWS, FEATURES, generator=g)
w_true = torch.randn(FEATURES, 1, generator=g)
y = torch.tanh(x @ w_true) + 0.05 * torch.randn(ROWS, 1, generator=g)

torch.manual_seed(args.seed)
model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                            torch.nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
epoch, step, loss_sum, attempt = 0, 0, 0.0, 0


def save():
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    tmp = CKPT + ".tmp"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch, "step": step,
                "loss_sum": loss_sum, "rng": torch.get_rng_state(), "attempt": attempt, "seed": args.seed}, tmp)
    os.replace(tmp, CKPT)


if os.path.exists(CKPT):
    state = torch.load(CKPT)
    if state.get("seed") != args.seed:
        sys.exit("checkpoint %s was written with seed %s, not %s" % (CKPT, state.get("seed"), args.seed))
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    epoch, step, loss_sum = state["epoch"], state["step"], state["loss_sum"]
    torch.set_rng_state(state["rng"])
    attempt = state["attempt"] + 1
    print("spot_checkpoint: resumed from %s at epoch=%d step=%d attempt=%d" % (CKPT, epoch, step, attempt),
          flush=True)
else:
    print("spot_checkpoint: no checkpoint in %s, starting at epoch=0 step=0" % args.checkpoint_dir, flush=True)

model.train()
while epoch < args.epochs:
    order = torch.randperm(ROWS, generator=torch.Generator().manual_seed(args.seed * 100003 + epoch))
    while step < STEPS:
        if TERM["requested"]:
            save()
            print("spot_checkpoint: SIGTERM, checkpoint saved at epoch=%d step=%d" % (epoch, step), flush=True)
            sys.exit(0)
        idx = order[step * BATCH:(step + 1) * BATCH]
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        loss_sum += loss.item()
        step += 1
        time.sleep(args.step_seconds)
    print("epoch=%d loss=%.6f" % (epoch, loss_sum / STEPS), flush=True)
    epoch, step, loss_sum = epoch + 1, 0, 0.0
    save()

torch.save(model.state_dict(), os.path.join(os.environ.get("SM_MODEL_DIR", "/opt/ml/model"), "model.pth"))
print("spot_checkpoint: done, model saved (%d steps)" % (args.epochs * STEPS), flush=True)
