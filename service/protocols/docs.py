"""The API docs (Swagger UI) served from this service's own files, so /docs works offline.

The Swagger UI assets come from the pinned PyPI package `fastapi-offline` (MIT; it vendors
swagger-ui-dist), read from its installed folder: nothing is fetched from a CDN.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.responses import FileResponse

from service.errors import NotFound

ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon.png": "image/png",
}


def assets_dir() -> Path:
    """The installed Swagger UI files."""
    return Path(str(resources.files("fastapi_offline") / "static"))


class DocsAPI:
    """`/docs` and its assets under `/docs/assets/`.

    Args:
        openapi_url: where the schema is (FastAPI's /openapi.json).
        title: the page's title.
    """

    def __init__(self, openapi_url: str, title: str):
        self.openapi_url = openapi_url
        self.title = title
        self.folder = assets_dir()
        missing = [name for name in ASSETS if not (self.folder / name).is_file()]
        if missing:
            raise FileNotFoundError(f"{self.folder}: missing Swagger UI files {missing}")
        self.router = APIRouter(include_in_schema=False)
        self.router.add_api_route("/docs", self.docs)
        self.router.add_api_route("/docs/assets/{name}", self.asset)

    async def docs(self):
        return get_swagger_ui_html(
            openapi_url=self.openapi_url,
            title=f"{self.title} - API docs",
            swagger_js_url="/docs/assets/swagger-ui-bundle.js",
            swagger_css_url="/docs/assets/swagger-ui.css",
            swagger_favicon_url="/docs/assets/favicon.png",
        )

    async def asset(self, name: str):
        media_type = ASSETS.get(name)
        if media_type is None:
            raise NotFound(f"no such file: /docs/assets/{name[:60]}")
        return FileResponse(self.folder / name, media_type=media_type)
