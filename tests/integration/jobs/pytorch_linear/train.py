"""Script-mode PyTorch training script (run by the training toolkit as `python3 train.py --epochs N
--lr X`): fits y = w.x + b on the CSV files of the `train` channel and saves the state dict."""
import argparse
import glob
import json
import os

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--lr", type=float, default=0.1)
args = parser.parse_args()

train_dir = os.environ["SM_CHANNEL_TRAIN"]
rows = []
for path in sorted(glob.glob(os.path.join(train_dir, "**", "*.csv"), recursive=True)):
    with open(path) as f:
        for line in f:
            if line.strip():
                rows.append([float(v) for v in line.split(",")])
data = torch.tensor(rows, dtype=torch.float32)
x, y = data[:, 1:], data[:, :1]
print("loaded %d rows with %d features from %s" % (x.shape[0], x.shape[1], train_dir), flush=True)

torch.manual_seed(0)
model = torch.nn.Linear(x.shape[1], 1)
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
losses = []
for epoch in range(args.epochs):
    for _ in range(10):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    with torch.no_grad():
        value = torch.nn.functional.mse_loss(model(x), y).item()
    losses.append(value)
    print("epoch=%d loss=%.6f" % (epoch, value), flush=True)

torch.save(model.state_dict(), os.path.join(os.environ["SM_MODEL_DIR"], "model.pth"))
out_dir = os.environ.get("SM_OUTPUT_DATA_DIR", "/opt/ml/output/data")
os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, "losses.json"), "w") as f:
    json.dump({"losses": losses, "hosts": json.loads(os.environ.get("SM_HOSTS", "[]"))}, f)
