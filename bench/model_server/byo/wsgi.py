# The WSGI entry point of SageMaker's bring-your-own example (wsgi.py): gunicorn serves `wsgi:app`.
import predictor as myapp

# This is just a simple wrapper for gunicorn to find your app.
# If you want to change the algorithm file, simply change "predictor" above to the
# new file.

app = myapp.app
