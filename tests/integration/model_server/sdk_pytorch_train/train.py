"""Script-mode PyTorch training script for test_sdk_deploy.py: a Linear(2, 1) fitted on
SM_CHANNEL_TRAIN/train.csv (y, x1, x2), its state_dict saved as SM_MODEL_DIR/model.pth."""
import argparse
import os

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR"))
parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAIN"))
args = parser.parse_args()

rows = []
with open(os.path.join(args.train, "train.csv")) as f:
    for line in f:
        if line.strip():
            rows.append([float(v) for v in line.split(",")])
data = torch.tensor(rows, dtype=torch.float32)
x, y = data[:, 1:], data[:, :1]
torch.manual_seed(0)
model = torch.nn.Linear(x.shape[1], 1)
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
for epoch in range(args.epochs):
    for _ in range(10):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    print("epoch=%d loss=%.6f" % (epoch, loss.item()), flush=True)
torch.save(model.state_dict(), os.path.join(args.model_dir, "model.pth"))
