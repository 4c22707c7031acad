"""What BatchGen serves, known to every side: the serving catalogue.

The endpoint specs (`serving/endpoints/`), the input line's shape and checks
(`line_schema.py`, `line_checks.py`), a request's parameters (`params.py`), the
served models (`model_info.py`, `model_prep.py`) and the engine registry with the
Engine contract (`serving/engines/`). The web process and the control worker read it
to validate and admit batches; the inference worker reads it to run them. It imports
only the base (`core`) and Django's settings, never `batches`, `inference` or
`webhooks` (tests/site/test_structure.py): the apps meet here, not in each other.
"""
