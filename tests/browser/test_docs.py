"""/docs and /redoc in headless Chromium: every operation rendered, Try it out works, nothing leaves loopback."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.browser.conftest import Watch
from tests.reliability.live_server import LiveServer

METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


def operations(server: LiveServer) -> list[tuple[str, str]]:
    schema = httpx.get(f"{server.base_url}/openapi.json", timeout=30).json()
    return [(method, path) for path, item in schema["paths"].items() for method in item if method in METHODS]


def test_swagger_ui_renders_every_operation_offline(watch: Watch, server: LiveServer) -> None:
    page = watch.page
    page.goto("/docs")
    page.wait_for_selector(".opblock")
    expected = operations(server)
    shown = page.eval_on_selector_all(
        ".opblock",
        """blocks => blocks.map(b => [
            b.querySelector('.opblock-summary-method').textContent.toLowerCase(),
            b.querySelector('.opblock-summary-path').getAttribute('data-path')])""",
    )
    assert sorted(map(tuple, shown)) == sorted(expected)
    assert page.locator("a[href='/ui']").count() >= 1, "the description links the inspector"
    assert all(url.startswith(server.base_url) or url.startswith("data:") for url in watch.requests)
    watch.screenshot("docs-swagger-ui", full_page=False)


def test_try_it_out_on_lenet_returns_200(watch: Watch, server: LiveServer) -> None:
    page = watch.page
    page.goto("/docs#/models/get_model_models__name__get")
    block = page.locator("#operations-models-get_model_models__name__get")
    block.wait_for()
    if not page.is_visible("#operations-models-get_model_models__name__get .try-out__btn"):
        block.locator(".opblock-summary-control").click()
    block.locator(".try-out__btn").click()
    name = block.locator("input[placeholder='name']")
    name.fill("lenet")
    block.locator(".execute").click()
    status = block.locator(".live-responses-table tbody .response-col_status").first
    status.wait_for()
    assert status.inner_text().strip() == "200"
    assert '"name": "lenet"' in block.locator(".live-responses-table .microlight").first.inner_text()
    watch.screenshot("docs-try-it-out", element=block)


def test_redoc_renders_every_operation_offline(watch: Watch, server: LiveServer) -> None:
    page = watch.page
    page.goto("/redoc")
    page.wait_for_selector("[data-section-id^='operation/']")
    count = page.locator("[data-section-id^='operation/']").count()
    assert count == len(operations(server))
    watch.screenshot("redoc", full_page=False)


@pytest.mark.parametrize("path", ["/", "/ui"])
def test_home_links_the_inspector_and_the_docs(watch: Watch, path: str) -> None:
    page = watch.page
    page.goto(path)
    for href in ("docs", "redoc"):
        assert page.locator(f"a[href='{href}']").count() >= 1
    if path == "/":
        page.click("a[href='ui']")
        page.wait_for_selector("#tree-body .tree-row")


SAMPLE = Path(__file__).resolve().parents[2] / "service" / "zoo" / "samples" / "digit_4.png"


def image_operations(server: LiveServer) -> list[tuple[str, str, str]]:
    """(tag, operationId, path) of every operation whose body takes images, in JSON or as form files."""
    schema = httpx.get(f"{server.base_url}/openapi.json", timeout=30).json()
    found = []
    for path, item in schema["paths"].items():
        for operation in item.values():
            form = operation.get("requestBody", {}).get("content", {}).get("multipart/form-data", {})
            if "image" in form.get("schema", {}).get("properties", {}):
                found.append((operation["tags"][0], operation["operationId"], path))
    return found


@pytest.mark.parametrize("content_type", ["application/json", "multipart/form-data"])
def test_try_it_out_runs_every_image_operation_as_pre_filled(
    watch: Watch, server: LiveServer, content_type: str
) -> None:
    """Try it out, change nothing but the file to upload, Execute: 200 for every operation that takes images."""
    page = watch.page
    operations = image_operations(server)
    assert {path for _, _, path in operations} >= {"/predict", "/saliency", "/activations", "/interventions"}
    answers: dict[str, str] = {}
    for tag, operation_id, path in operations:
        page.goto(f"/docs#/{tag}/{operation_id}")
        block = page.locator(f"#operations-{tag}-{operation_id}")
        block.wait_for()
        if not block.locator(".try-out__btn").is_visible():
            block.locator(".opblock-summary-control").click()
        block.locator(".try-out__btn").click()
        if content_type != "application/json":
            block.locator(".body-param-content-type select").select_option(content_type)
            block.locator("input[type=file]").first.set_input_files(str(SAMPLE))
        block.locator(".execute").click()
        status = block.locator(".live-responses-table tbody .response-col_status").first
        status.wait_for()
        answers[path] = status.inner_text().strip()
        if answers[path] != "200":
            answers[path] += ": " + block.locator(".live-responses-table .microlight").first.inner_text()[:400]
        if path == "/predict":
            watch.screenshot(f"docs-try-it-out-predict-{content_type.rsplit('/', maxsplit=1)[-1]}", element=block)
    assert all(status == "200" for status in answers.values()), answers
