"""Entry point for SKLearnModel (test_sdk_deploy.py): model_fn loads model.joblib; predict and the
JSON codecs are the scikit-learn framework defaults."""
import os

import joblib


def model_fn(model_dir):
    return joblib.load(os.path.join(model_dir, "model.joblib"))
