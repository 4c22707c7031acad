"""gunicorn's configuration for BatchGen's web server; `manage.py serve` runs gunicorn
with `--config python:batchgen_site.gunicorn_conf`. Process and thread counts, the
bind address and the logs stay on serve's command line."""

# gunicorn's threaded worker with deadlines for slow clients, a share of threads for
# request bodies and the error envelope for gunicorn's own refusals (see the module).
worker_class = "batchgen_site.gunicorn_worker.BatchGenWorker"

# Seconds an idle kept-alive connection stays open, and a new one may take to send its
# first bytes (it waits in the worker's poller meanwhile, holding no thread). gunicorn's
# default of 2 s is short for a client on a slow link; this is still well below what
# a flood of idle connections would need to matter (1,000 per worker process).
keepalive = 5
