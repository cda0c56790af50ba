"""Script-mode scikit-learn training script for the SDK's SKLearn estimator (Debian's
python3-sklearn): ridge regression on SM_CHANNEL_TRAIN/train.csv, saved with joblib."""
import argparse
import os

import joblib
import numpy as np
from sklearn.linear_model import Ridge

parser = argparse.ArgumentParser()
parser.add_argument("--alpha", type=float, default=1.0)
parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR"))
parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAIN"))
args = parser.parse_args()

data = np.loadtxt(os.path.join(args.train, "train.csv"), delimiter=",", ndmin=2)
x, y = data[:, 1:], data[:, 0]
model = Ridge(alpha=args.alpha).fit(x, y)
print("r2=%.6f" % model.score(x, y), flush=True)
print("coef=%s intercept=%.6f" % (",".join("%.6f" % c for c in model.coef_), model.intercept_), flush=True)
joblib.dump(model, os.path.join(args.model_dir, "model.joblib"))
