"""A model that cannot load (test_model_server.py): model_fn raises, so the program must log the
traceback and exit 1 at once in single-model mode."""


def model_fn(model_dir):
    raise RuntimeError("kiln-test: the weights in %s are corrupt" % model_dir)


def predict_fn(data, model):
    return data
