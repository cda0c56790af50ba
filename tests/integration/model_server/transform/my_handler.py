"""transform_fn with the trailing context argument (test_model_server.py), shipped as
sourcedir.tar.gz through SAGEMAKER_SUBMIT_DIRECTORY with SAGEMAKER_PROGRAM=my_handler.py: echoes
what it was given (the body's Python type: str for JSON/CSV, bytes otherwise) and answers the
request's custom attributes back through the response header."""
import json

import helper_module  # beside this file in the tarball: the code directory is on sys.path


def model_fn(model_dir):
    return helper_module.MODEL


def transform_fn(model, body, content_type, accept, context):
    attrs = context.get_request_header(0, "X-Amzn-SageMaker-Custom-Attributes")
    context.set_response_header(0, "X-Amzn-SageMaker-Custom-Attributes", "seen=%s" % attrs)
    text = body if isinstance(body, str) else body.hex()
    return json.dumps({"model": model, "type": type(body).__name__, "body": text,
                       "content_type": content_type, "accept": accept, "attrs": attrs}), "application/json"
