"""The API docs (Swagger UI) served from this service's own files, so /docs works offline.

The Swagger UI assets come from the PyPI package `fastapi-offline` (MIT; it vendors
swagger-ui-dist), read from its installed folder: nothing is fetched from a CDN. The document
itself is written from the routes' declarations (service/openapi.py).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import orjson
from starlette.responses import FileResponse, HTMLResponse, Response

from service.errors import NotFound
from service.routes import Call, Route

ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon.png": "image/png",
}


def assets_dir() -> Path:
    """The installed Swagger UI files."""
    return Path(str(resources.files("fastapi_offline") / "static"))


# Swagger UI's page, pointed at this service's files and document.
PAGE = """<!DOCTYPE html>
<html>
<head>
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<link type="text/css" rel="stylesheet" href="/docs/assets/swagger-ui.css">
<link rel="shortcut icon" href="/docs/assets/favicon.png">
<title>{title} - API docs</title>
</head>
<body>
<div id="swagger-ui"></div>
<script src="/docs/assets/swagger-ui-bundle.js"></script>
<script>
const ui = SwaggerUIBundle({{
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
}})
</script>
</body>
</html>
"""


class DocsAPI:
    """`/openapi.json`, `/docs` and the docs' files under `/docs/assets/`.

    Args:
        document: the OpenAPI document (service/openapi.py), made at its first request.
        title: the page's title.
    """

    def __init__(self, document: Callable[[], dict], title: str):
        self.document = document
        self.page = HTMLResponse(PAGE.format(title=html.escape(title))).body
        self._json: bytes | None = None
        self.folder = assets_dir()
        missing = [name for name in ASSETS if not (self.folder / name).is_file()]
        if missing:
            raise FileNotFoundError(f"{self.folder}: missing Swagger UI files {missing}")

    def routes(self) -> list[Route]:
        """The document and the page that shows it: open to all, and not in the document."""
        return [
            Route("GET", "/openapi.json", self.openapi, "The OpenAPI document", None,
                  documented=False),
            Route("GET", "/docs", self.docs, "The API docs", None, documented=False),
            Route("GET", "/docs/assets/{name}", self.asset, "The API docs' files", None,
                  documented=False),
        ]  # fmt: skip

    async def openapi(self, call: Call):
        if self._json is None:
            self._json = orjson.dumps(self.document())
        return Response(self._json, media_type="application/json")

    async def docs(self, call: Call):
        return HTMLResponse(self.page)

    async def asset(self, call: Call, name: str):
        media_type = ASSETS.get(name)
        if media_type is None:
            raise NotFound(f"no such file: /docs/assets/{name[:60]}")
        return FileResponse(self.folder / name, media_type=media_type)
