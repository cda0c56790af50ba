"""Script-mode PyTorch training script for the console's browser tests (run by the training toolkit
as `python3 train.py --epochs N --interval S`): fits a small regression on synthetic data, one epoch
every `interval` seconds, printing `epoch=<i> loss=<x>` so that the console's log tail grows and its
loss chart (MetricDefinitions regex `loss=([0-9.]+)`) gains a point per epoch."""
import argparse
import os
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=60)
parser.add_argument("--interval", type=float, default=0.5)
args = parser.parse_args()

torch.manual_seed(0)
x = torch.rand(256, 4)
y = x @ torch.tensor([[2.0], [-3.0], [0.5], [1.0]]) + 0.25
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
print("training %d epochs, one every %.2f s" % (args.epochs, args.interval), flush=True)
for epoch in range(args.epochs):
    started = time.monotonic()
    for _ in range(5):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    print("epoch=%d loss=%.6f" % (epoch, loss.item()), flush=True)
    time.sleep(max(0.0, args.interval - (time.monotonic() - started)))

torch.save(model.state_dict(), os.path.join(os.environ["SM_MODEL_DIR"], "model.pth"))
print("saved the model", flush=True)
