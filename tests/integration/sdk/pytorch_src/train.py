"""Script-mode PyTorch training script for the SDK tests, written as SageMaker users write them:
hyperparameters as arguments, the channel's file read directly from SM_CHANNEL_TRAIN (the SDK's
upload_data() gives a prefix without a trailing slash), the model saved to SM_MODEL_DIR."""
import argparse
import json
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
print("loaded %d rows with %d features" % (x.shape[0], x.shape[1]), flush=True)

torch.manual_seed(0)
model = torch.nn.Linear(x.shape[1], 1)
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
for epoch in range(args.epochs):
    for _ in range(10):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    with torch.no_grad():
        value = torch.nn.functional.mse_loss(model(x), y).item()
    print("epoch=%d loss=%.6f" % (epoch, value), flush=True)

torch.save(model.state_dict(), os.path.join(args.model_dir, "model.pth"))
with open(os.path.join(args.model_dir, "model.json"), "w") as f:
    json.dump({"w": model.weight.detach()[0].tolist(), "b": model.bias.detach()[0].item()}, f)
