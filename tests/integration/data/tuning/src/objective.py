#!/usr/bin/python3
"""The training program of the tuning tests (tests/integration/test_tuning.py) and of
bench/tuning_overhead_bench.py: a test function trained "epoch" by epoch, printing its objective
once per epoch for a MetricDefinition regex (`objective=([0-9.]+)`):

    epoch=1 objective=12.345678

It runs both ways Kiln starts training code: as a script-mode entry point (the SageMaker SDK's
PyTorch estimator; Kiln's toolkit runs `python3 objective.py --x1 ...` with SM_HPS set) and as a
`local:` image (`objective.py train`, hyperparameters read from
/opt/ml/input/config/hyperparameters.json). Values may be JSON-encoded (the SDK encodes its static
hyperparameters) or plain text (tuned values), as SageMaker's toolkits accept them.

Hyperparameters (all optional):
  function       "branin" (default) or "optimizer"
  x1, x2         Branin's inputs (x1 in [-5, 10], x2 in [0, 15]); its minimum is 0.397887 at
                 (-pi, 12.275), (pi, 2.275) and (9.42478, 2.475)
  optimizer      for "optimizer": sgd, momentum, adam, nesterov converge (loss = base + 1/epoch);
                 "broken" diverges (loss = 5 + 0.1 * epoch), so the median rule must stop it
  layers         for "optimizer": adds 0.01 * layers to the loss
  epochs         number of epochs (default 5)
  epoch_seconds  sleep per epoch (default 0.1)
  shift          added to every value (default 0)

Branin's curve falls to the function's value at the last epoch: value(e) = f + (f + 1) * (E - e) / E,
so its final objective (the last value) is exactly f(x1, x2) and every epoch ranks configurations
as the final value does (what Hyperband's rungs rely on).
"""
import json
import math
import os
import signal
import sys
import time

BASE = {"sgd": 0.30, "momentum": 0.25, "adam": 0.20, "nesterov": 0.22}


def branin(x1, x2):
    a, b, c = 1.0, 5.1 / (4 * math.pi ** 2), 5 / math.pi
    r, s, t = 6.0, 10.0, 1 / (8 * math.pi)
    return a * (x2 - b * x1 ** 2 + c * x1 - r) ** 2 + s * (1 - t) * math.cos(x1) + s


def decode(raw):
    out = {}
    for k, v in raw.items():
        try:
            v = json.loads(v)
        except (TypeError, ValueError):
            pass
        out[k] = v
    return out


def hyperparameters():
    if os.environ.get("SM_HPS"):  # script mode: the toolkit decoded them already
        return json.loads(os.environ["SM_HPS"])
    config = os.environ.get("SM_INPUT_CONFIG_DIR", "/opt/ml/input/config")
    with open(os.path.join(config, "hyperparameters.json")) as f:
        return decode(json.load(f))


def main():
    hp = hyperparameters()
    print("hyperparameters=" + json.dumps(hp, sort_keys=True), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: (print("stopped by SIGTERM", flush=True), sys.exit(0)))
    epochs = int(hp.get("epochs", 5))
    pause = float(hp.get("epoch_seconds", 0.1))
    shift = float(hp.get("shift", 0))
    function = hp.get("function", "branin")
    if function == "branin":
        f = branin(float(hp["x1"]), float(hp["x2"]))

        def value(e):
            return f + (f + 1) * (epochs - e) / epochs
    elif function == "optimizer":
        opt = str(hp["optimizer"])
        layers = float(hp.get("layers", 0))

        def value(e):
            if opt == "broken":
                return 5 + 0.1 * e
            return BASE[opt] + 0.01 * layers + 1.0 / e
    else:
        raise SystemExit("unknown function %r" % function)
    for e in range(1, epochs + 1):
        time.sleep(pause)
        print("epoch=%d objective=%.6f" % (e, value(e) + shift), flush=True)
    model_dir = os.environ.get("SM_MODEL_DIR", "/opt/ml/model")
    with open(os.path.join(model_dir, "result.json"), "w") as out:
        json.dump({"epochs": epochs, "objective": value(epochs) + shift}, out)


if __name__ == "__main__":
    main()
