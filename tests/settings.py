"""Settings for the in-process tests: the real settings, with an in-memory broker
(tests inspect what was published instead of running workers) and the simulated
engine. End-to-end tests start real processes with batchgen_site.settings."""

import os
import tempfile

os.environ.setdefault("BATCHGEN_STORAGE_PATH", tempfile.mkdtemp(prefix="batchgen-test-"))
os.environ.setdefault("BATCHGEN_ENGINE", "simulated")
# The tests' lines name the model "m": serve it (an unserved model is refused per line).
os.environ.setdefault("BATCHGEN_MODELS", "m=" + os.path.join(
    os.environ["BATCHGEN_STORAGE_PATH"], "models", "SmolLM2-135M-Instruct"))

from batchgen_site.settings import *  # noqa: E402,F403

CELERY_BROKER_URL = "memory://"
BATCHGEN_EMBEDDED_BROKER = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":  # noqa: F405
    # A file, not shared memory: concurrent transactions then wait on the lock as
    # they do in production instead of failing with "table is locked".
    DATABASES["default"]["TEST"] = {  # noqa: F405
        "NAME": os.path.join(os.environ["BATCHGEN_STORAGE_PATH"], "test.sqlite3")
    }
