"""GET /ui, the inspector page, and its static files; GET / links it with the OpenAPI pages.

The page talks to the public HTTP API only; these routes just hand out files that ship in the
package (the page's HTML, CSS and JavaScript, and the sample digits for the zoo's LeNet and ViT).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from fastapi.responses import FileResponse
from starlette.staticfiles import StaticFiles

from service.api.deps import PlaneDep
from service.ui import STATIC_DIR
from service.zoo.lenet import samples_dir

router = APIRouter(include_in_schema=False)

ZOO_DIGITS = ("service.zoo.lenet:LeNet", "service.zoo.vit:DigitsViT")  # the models the sample digits are for
_static = StaticFiles(directory=STATIC_DIR)
_samples = StaticFiles(directory=samples_dir())
AssetPath = Annotated[str, Path(description="A file under the page's static folder.")]
# The page may talk to this server only: no script, style, image or request from anywhere else.
CSP = (
    "default-src 'self'; script-src 'self'; connect-src 'self'; img-src 'self' data: blob:; "
    "style-src 'self' 'unsafe-inline'; object-src 'none'; base-uri 'self'; frame-ancestors 'self'"
)
PAGE_HEADERS = {"Cache-Control": "no-cache", "Content-Security-Policy": CSP}


@router.get("/")
async def home() -> FileResponse:
    """A small landing page: the inspector, the OpenAPI pages, health and metrics."""
    return FileResponse(STATIC_DIR / "home.html", media_type="text/html", headers=PAGE_HEADERS)


@router.get("/ui")
async def inspector() -> FileResponse:
    """The inspector: one HTML page whose scripts call the public API."""
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html", headers=PAGE_HEADERS)


@router.get("/ui/static/{path:path}")
async def static_file(path: AssetPath, request: Request) -> Response:
    """The page's CSS and JavaScript (ETag and 304 as StaticFiles does; no path leaves the folder)."""
    response = await _static.get_response(path, request.scope)
    response.headers["Cache-Control"] = "no-cache"  # revalidate: a new release must not run stale scripts
    return response


@router.get("/ui/samples")
async def samples(plane: PlaneDep) -> dict[str, list[dict[str, str]]]:
    """Sample images per served model name: the held-out digits for every model that is the zoo's LeNet or ViT."""
    digits = [
        {"name": f.stem, "label": f.stem.removeprefix("digit_"), "url": f"ui/samples/{f.name}"}
        for f in sorted(samples_dir().glob("digit_*.png"))
    ]
    models = [m.name for m in plane.models() if m.architecture in ZOO_DIGITS]
    return dict.fromkeys(models, digits)


@router.get("/ui/samples/{path:path}")
async def sample_file(path: AssetPath, request: Request) -> Response:
    """One shipped sample image."""
    return await _samples.get_response(path, request.scope)
