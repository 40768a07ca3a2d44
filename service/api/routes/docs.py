"""GET /docs (Swagger UI) and GET /redoc with their JavaScript and CSS served from the package.

FastAPI's own pages load Swagger UI and ReDoc from a CDN, so on an offline machine they are
blank. The `fastapi-offline` wheel ships both bundles (re-released as they update); we serve its
files at /docs-assets and point the pages there, so no request leaves the machine.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path as FilePath
from typing import Annotated, Any

import fastapi_offline
from fastapi import APIRouter, Path, Request, Response
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

router = APIRouter(include_in_schema=False)

ASSETS_DIR = FilePath(fastapi_offline.__file__).resolve().parent / "static"
ASSETS_URL = "/docs-assets"
OPENAPI_URL = "/openapi.json"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
TITLE = "hookserve"
CACHE = "public, max-age=86400"
SWAGGER_PARAMETERS: dict[str, Any] = {
    "deepLinking": True,
    "showExtensions": True,
    "showCommonExtensions": True,
    "validatorUrl": None,  # Swagger UI's default sends the schema to an online validator
    "tryItOutEnabled": False,
}
# ReDoc's sidebar footer always loads its vendor's logo from a CDN; an empty data URL instead
# makes the image fail locally, and ReDoc then leaves it out.
REMOTE_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"
OFFLINE_LOGO = b"data:,"
_assets = StaticFiles(directory=ASSETS_DIR)
AssetPath = Annotated[str, Path(description="A Swagger UI or ReDoc file.")]


def _root(request: Request) -> str:
    """The mount prefix behind a proxy (`--root-path`), so the pages find their files there too."""
    return str(request.scope.get("root_path", "")).rstrip("/")


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    """The OpenAPI page (Swagger UI) with every asset from this server."""
    root = _root(request)
    return get_swagger_ui_html(
        openapi_url=f"{root}{OPENAPI_URL}",
        title=f"{TITLE} - Swagger UI",
        swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
        oauth2_redirect_url=f"{root}{OAUTH2_REDIRECT_URL}",
        swagger_ui_parameters=SWAGGER_PARAMETERS,
    )


@router.get(OAUTH2_REDIRECT_URL)
async def swagger_ui_redirect() -> HTMLResponse:
    """Swagger UI's OAuth2 helper page (no CDN involved)."""
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    """The same schema as ReDoc renders it, without Google Fonts."""
    root = _root(request)
    return get_redoc_html(
        openapi_url=f"{root}{OPENAPI_URL}",
        title=f"{TITLE} - ReDoc",
        redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
        redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
        with_google_fonts=False,
    )


@router.get(f"{ASSETS_URL}/{{path:path}}")
async def asset(path: AssetPath, request: Request) -> Response:
    """Swagger UI's and ReDoc's bundles, CSS and favicon, from the installed wheel."""
    if path == "redoc.standalone.js":
        return Response(_offline_redoc(), media_type="text/javascript", headers={"Cache-Control": CACHE})
    response = await _assets.get_response(path, request.scope)
    response.headers.setdefault("Cache-Control", CACHE)
    return response


@cache
def _offline_redoc() -> bytes:
    """ReDoc's bundle with its one hard-wired outside address (the footer logo) made local."""
    return (ASSETS_DIR / "redoc.standalone.js").read_bytes().replace(REMOTE_LOGO, OFFLINE_LOGO)
