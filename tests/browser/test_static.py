"""The page's files and routes without a browser: served from the package, nothing fetched from outside."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from service.codecs.colormap import INFERNO
from service.ui import STATIC_DIR
from tests.reliability.live_server import REPO_ROOT

EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["'](?:https?:)?//""", re.IGNORECASE)


def test_the_js_colormap_equals_the_servers() -> None:
    text = (STATIC_DIR / "js" / "colormap.js").read_text()
    hexes = "".join(re.findall(r'"([0-9a-f]+)"', text.split("const HEX =", 1)[1].split(";", 1)[0]))
    assert bytes.fromhex(hexes) == INFERNO.tobytes()


def test_no_page_file_names_an_outside_address() -> None:
    for path in STATIC_DIR.rglob("*"):
        if path.suffix in (".html", ".js", ".css"):
            text = path.read_text()
            assert not EXTERNAL.search(text), path
            assert "import(" not in text or path.suffix != ".js", path
            assert not re.search(r"""from\s+["']https?:""", text), path


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/", "text/html"),
        ("/ui", "text/html"),
        ("/ui/static/js/main.js", "text/javascript"),
        ("/ui/static/inspector.css", "text/css"),
        ("/ui/static/favicon.svg", "image/svg+xml"),
        ("/ui/samples/digit_7.png", "image/png"),
        ("/docs", "text/html"),
        ("/redoc", "text/html"),
        ("/docs/oauth2-redirect", "text/html"),
        ("/docs-assets/swagger-ui-bundle.js", "text/javascript"),
        ("/docs-assets/swagger-ui.css", "text/css"),
        ("/docs-assets/redoc.standalone.js", "text/javascript"),
        ("/docs-assets/favicon.png", "image/png"),
    ],
)
def test_pages_and_assets_are_served(builtin_client: TestClient, path: str, kind: str) -> None:
    answer = builtin_client.get(path)
    assert answer.status_code == 200, answer.text[:200]
    assert answer.headers["content-type"].startswith(kind)


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/", "/ui"])
def test_the_html_pages_load_nothing_from_outside(builtin_client: TestClient, path: str) -> None:
    html = builtin_client.get(path).text
    assert not EXTERNAL.search(html), html[:500]
    assert "cdn.jsdelivr.net" not in html
    assert "fastapi.tiangolo.com" not in html
    assert "fonts.googleapis.com" not in html


OUTSIDE = [
    "/ui/static/../../config.py",
    "/ui/static/%2e%2e/%2e%2e/config.py",
    "/ui/static/nope.js",
    "/docs-assets/../x",
]


@pytest.mark.parametrize("path", OUTSIDE)
def test_static_routes_stay_inside_their_folder(builtin_client: TestClient, path: str) -> None:
    assert builtin_client.get(path).status_code == 404


def test_samples_are_listed_for_the_zoo_digit_models_only(builtin_client: TestClient) -> None:
    samples = builtin_client.get("/ui/samples").json()
    assert list(samples) == ["lenet", "vit_digits"]
    assert samples["vit_digits"] == samples["lenet"]
    assert [s["label"] for s in samples["lenet"]] == [str(d) for d in range(10)]
    assert builtin_client.get("/" + samples["lenet"][3]["url"]).content.startswith(b"\x89PNG")


def test_the_ui_routes_stay_out_of_the_schema(builtin_client: TestClient) -> None:
    paths = builtin_client.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p in ("/", "/docs", "/redoc") or p.startswith(("/ui", "/docs-assets"))]


def test_the_readme_shows_the_suites_picture_of_the_page() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    assert "](docs/inspector.png)" in readme
    picture = REPO_ROOT / "docs" / "inspector.png"
    assert picture.read_bytes().startswith(b"\x89PNG")
    assert picture.stat().st_size < 200_000, "keep the README picture small (256 colours, 960 px wide)"
    with Image.open(picture) as image:
        assert image.width == 960


@pytest.mark.parametrize("path", ["/", "/ui"])
def test_the_pages_may_only_reach_this_server(builtin_client: TestClient, path: str) -> None:
    policy = builtin_client.get(path).headers["content-security-policy"]
    assert "default-src 'self'" in policy
    assert "connect-src 'self'" in policy
    assert "script-src 'self';" in policy
