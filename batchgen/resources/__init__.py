"""The client's resources, in the manner of openai-python: `client.files`,
`client.batches`, `client.models`, `client.pool`, `client.webhook_endpoints`. Each
method is one API call (or a wait built of them) returning a typed object of
`batchgen.types` or a cursor page of them (`batchgen.pagination`); errors are those
of `batchgen.errors`, and every call retries as the client's do.

They sit on the client's dict-returning methods (`client.get_batch(...)`, the guide's
API), which stay as they are: a typed object is built from the same JSON.
"""

from batchgen.resources.batches import Batches
from batchgen.resources.files import BinaryContent, Files
from batchgen.resources.models import Models, Pool
from batchgen.resources.webhook_endpoints import WebhookEndpoints

__all__ = ["Batches", "BinaryContent", "Files", "Models", "Pool", "WebhookEndpoints"]
