"""Print the API's OpenAPI document, as `GET /openapi.json` serves it; `make openapi` writes it to docs/openapi.json
(a test keeps that file equal to this output).

    python -m enqueue_api.app > docs/openapi.json
"""

from enqueue_api.app import openapi_document
from enqueue_api.app.openapi import document_text

print(document_text(openapi_document()), end="")
