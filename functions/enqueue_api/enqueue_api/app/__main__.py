"""Print the API's OpenAPI document, as `GET /openapi.json` serves it, or write it whole to a file; `make openapi`
writes docs/openapi.json (a test keeps that file equal to this output).

    python -m enqueue_api.app [--write docs/openapi.json]
"""

import argparse
import os
import tempfile
from pathlib import Path

from enqueue_api.app import openapi_document
from enqueue_api.app.openapi import document_text

parser = argparse.ArgumentParser(prog="python -m enqueue_api.app", description=__doc__.splitlines()[0])
parser.add_argument("--write", type=Path, metavar="PATH", help="write the document to PATH instead of printing it")
arguments = parser.parse_args()
text = document_text(openapi_document())
if arguments.write is None:
    print(text, end="")
else:
    # Written aside and renamed: a failure never leaves an empty or partial document where the old one was.
    descriptor, staging = tempfile.mkstemp(dir=arguments.write.parent, prefix=f".{arguments.write.name}-")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(staging, arguments.write)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise
