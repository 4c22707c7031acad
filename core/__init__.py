"""The shared base every app imports: errors and their OpenAI envelope, pagination,
representation, ids, parsers, API keys and their authentication, the Celery app and
publishing, transient retries and outages, the settings table. It imports no app
(tests/site/test_structure.py); the project shell, batchgen_site, sits above them all."""
