import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batchgen_site.settings")
django_application = get_wsgi_application()

from batchgen_site.chunked import ChunkedBodies  # noqa: E402 - needs Django set up

application = ChunkedBodies(django_application)
