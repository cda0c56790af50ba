"""inference.py for the pytorch-inference image (test_sdk_deploy.py): model_fn loads the trained
Linear(2, 1) from model.pth; predict_fn raises when the first value is -999 (the ModelError test)
and otherwise runs the model; input_fn/output_fn are the framework defaults (JSON in and out)."""
import os

import torch


def model_fn(model_dir):
    model = torch.nn.Linear(2, 1)
    model.load_state_dict(torch.load(os.path.join(model_dir, "model.pth"), map_location="cpu"))
    model.eval()
    return model


def predict_fn(data, model):
    data = torch.as_tensor(data, dtype=torch.float32)
    if data.numel() and float(data.reshape(-1)[0]) == -999.0:
        raise ValueError("kiln-sdk-test: -999 is not a valid feature value")
    with torch.no_grad():
        return model(data)
