"""The token view of a vision transformer's layer (issue "Inspector II"): for an `[N, T, D]` output on the digits ViT,
each patch token's L2 norm as a map over the 8×8 patch grid with the class token beside it, a token picked by click
or keyboard shown as its D = 64 values, and the picked token kept in the URL. Every number drawn is checked against
the API's /activations answer. Screenshots in tests/artifacts/browser/token-view-*.png."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import numpy as np
import pytest

from tests.browser.conftest import Watch
from tests.browser.inspector_page import no_horizontal_overflow, open_inspector, select_layer
from tests.conftest import b64, sample_png
from tests.reliability.live_server import LiveServer

if TYPE_CHECKING:
    from numpy.typing import NDArray
    from playwright.sync_api import Page

DIGIT = 7
LAYER = "blocks.3"
VIEW = f"model=vit_digits&sample=digit_{DIGIT}&layer={LAYER}"
ROWS = COLS = 8
DEPTH = 64


def api_tokens(server: LiveServer, layer: str) -> NDArray[np.float64]:
    """The API's output of `layer` for the sample digit, first input: `[T, D]` (JSON tensors)."""
    body = {"model": "vit_digits", "inputs": [{"image": b64(sample_png(DIGIT))}], "layers": [layer]}
    answer = httpx.post(f"{server.base_url}/activations", json=body, timeout=60)
    assert answer.status_code == 200, answer.text[:300]
    payload = answer.json()["activations"][layer]["output"]
    values: NDArray[np.float64] = np.asarray(payload["data"], dtype=np.float64).reshape(payload["shape"])[0]
    return values


def patch_token(row: int, col: int) -> int:
    return 1 + row * COLS + col  # the class token first, then the patches row by row


def wait_tokens(page: Page, token: int | None = None) -> None:
    page.wait_for_selector("#token-view:not([hidden])", timeout=120_000)
    page.wait_for_selector('#layer-view[aria-busy="false"]')
    if token is not None:
        page.wait_for_selector(f'#token-view[data-token="{token}"]')


def cell_norm(page: Page, token: int) -> float:
    return float(page.get_attribute(f'.token-cell[data-token="{token}"]', "data-norm") or "nan")


def brightness(page: Page, token: int) -> float:
    """The summed RGB of a patch cell's colour (inferno: brighter is larger)."""
    colour = page.eval_on_selector(f'.token-cell[data-token="{token}"]', "c => getComputedStyle(c).backgroundColor")
    return float(sum(int(v) for v in str(colour)[4:-1].split(",")))


def opened(page: Page, server: LiveServer) -> NDArray[np.float64]:
    """The page on the ViT layer with its token view drawn; the API's `[T, D]` values of that layer."""
    open_inspector(page, VIEW)
    wait_tokens(page)
    return api_tokens(server, LAYER)


def click_bar(page: Page, dim: int) -> tuple[int, float]:
    """Click bar `dim` of the selected token; the dimension and value the page then states."""
    bars = page.locator("#token-bars")
    bars.scroll_into_view_if_needed()
    box = bars.bounding_box()
    assert box is not None
    page.mouse.click(box["x"] + box["width"] * (dim + 0.5) / DEPTH, box["y"] + box["height"] / 2)
    page.wait_for_selector(f'#token-dim[data-dim="{dim}"]')
    return dim, float(page.get_attribute("#token-dim", "data-value") or "nan")


def test_the_norms_drawn_are_the_apis_with_the_class_token_beside_the_grid(watch: Watch, server: LiveServer) -> None:
    page = watch.page
    page.set_viewport_size({"width": 1280, "height": 800})
    values = opened(page, server)
    assert values.shape == (1 + ROWS * COLS, DEPTH)
    norms = np.linalg.norm(values, axis=1)
    assert page.eval_on_selector_all("#token-grid .token-cell", "cells => cells.length") == ROWS * COLS
    cls = page.locator('#token-prefix .token-cell[data-token="0"]')
    assert cls.get_attribute("data-name") == "cls"  # as the API names it
    assert "cls" in cls.inner_text()
    for token in (0, patch_token(0, 0), patch_token(3, 5), patch_token(7, 7)):
        assert cell_norm(page, token) == pytest.approx(norms[token], rel=1e-5)
        label = page.get_attribute(f'.token-cell[data-token="{token}"]', "aria-label") or ""
        assert f"token {token}" in label
        shown = float(label.rsplit("L2 norm ", 1)[1])
        assert shown == pytest.approx(norms[token], rel=1e-3)  # four significant digits
    assert page.get_attribute(f'.token-cell[data-token="{patch_token(3, 5)}"]', "data-row") == "3"
    drawn = page.evaluate("window.hookserveInspector.layerView.tokenView.drawn()")
    np.testing.assert_allclose([drawn[str(t)] for t in range(len(norms))], norms, rtol=1e-5)
    patches = norms[1:]
    low, high = 1 + int(patches.argmin()), 1 + int(patches.argmax())
    assert brightness(page, low) < brightness(page, high)  # the colours keep the norms' order
    bar = page.locator("#token-colorbar")
    assert "L2 norm" in bar.inner_text()
    assert float(bar.get_attribute("data-lo") or "nan") == pytest.approx(norms.min(), rel=1e-5)
    assert float(bar.get_attribute("data-hi") or "nan") == pytest.approx(norms.max(), rel=1e-5)
    assert page.is_visible("#grid-figure")  # the per-unit maps stay under the token view
    assert page.is_hidden("#token-detail")  # nothing picked yet


def test_a_clicked_patch_shows_its_64_values_as_bars(watch: Watch, server: LiveServer) -> None:
    page = watch.page
    page.set_viewport_size({"width": 1280, "height": 800})
    values = opened(page, server)
    token = patch_token(3, 5)
    page.click(f'.token-cell[data-token="{token}"]')
    wait_tokens(page, token)
    assert page.get_attribute(f'.token-cell[data-token="{token}"]', "aria-pressed") == "true"
    assert page.get_attribute("#token-bars", "data-units") == str(DEPTH)
    where = page.inner_text("#token-where")
    assert f"Token {token}" in where
    assert "row 3, column 5" in where
    for dim in (0, 10, 63):
        _, value = click_bar(page, dim)
        assert value == pytest.approx(values[token, dim], rel=1e-5, abs=1e-6)
    assert f"token={token}" in page.url
    watch.screenshot("token-view-1280", element=page.locator("#layer-view"))

    page.click('.token-cell[data-token="0"]')
    wait_tokens(page, 0)
    assert "the cls token" in page.inner_text("#token-where")
    _, value = click_bar(page, 5)
    assert value == pytest.approx(values[0, 5], rel=1e-5, abs=1e-6)


def test_arrow_keys_move_over_the_tokens_and_enter_picks_one(watch: Watch, server: LiveServer) -> None:
    page = watch.page
    values = opened(page, server)
    page.focus(f'.token-cell[data-token="{patch_token(0, 0)}"]')
    for key in ("ArrowRight", "ArrowRight", "ArrowDown"):
        page.keyboard.press(key)
    page.keyboard.press("Enter")
    token = patch_token(1, 2)
    wait_tokens(page, token)
    assert page.evaluate("document.activeElement.dataset.token") == str(token)
    for _ in range(3):
        page.keyboard.press("ArrowLeft")  # past column 0: the prefix tokens
    assert page.evaluate("document.activeElement.dataset.name") == "cls"
    page.keyboard.press("Enter")
    wait_tokens(page, 0)
    page.focus("#token-bars")
    page.keyboard.press("ArrowRight")
    page.wait_for_selector('#token-dim[data-dim="0"]')
    assert float(page.get_attribute("#token-dim", "data-value") or "nan") == pytest.approx(values[0, 0], rel=1e-5)


def test_the_token_comes_back_from_the_url_and_stays_across_blocks(watch: Watch, server: LiveServer) -> None:
    page = watch.page
    token = patch_token(2, 6)
    open_inspector(page, f"{VIEW}&token={token}")
    wait_tokens(page, token)
    assert "row 2, column 6" in page.inner_text("#token-where")
    page.reload()
    wait_tokens(page, token)
    _, value = click_bar(page, 7)
    assert value == pytest.approx(api_tokens(server, LAYER)[token, 7], rel=1e-5, abs=1e-6)
    page.fill("#filter", "blocks.0.mlp.*")
    page.press("#filter", "Enter")
    select_layer(page, "blocks.0.mlp.fc1")  # [N, T, 4D]: the same token, its own width
    fc1 = api_tokens(server, "blocks.0.mlp.fc1")
    page.wait_for_selector(f'#token-bars[data-units="{fc1.shape[1]}"]')
    wait_tokens(page, token)
    assert cell_norm(page, token) == pytest.approx(np.linalg.norm(fc1[token]), rel=1e-5)
    assert f"token={token}" in page.url
    page.fill("#filter", "head")
    page.press("#filter", "Enter")
    select_layer(page, "head")  # [N, classes]: no tokens, no token view
    page.wait_for_selector("#token-view", state="hidden")


def test_no_horizontal_scroll_on_a_phone(watch: Watch, server: LiveServer) -> None:
    page = watch.page
    page.set_viewport_size({"width": 390, "height": 844})
    open_inspector(page, f"{VIEW}&token={patch_token(4, 1)}")
    wait_tokens(page, patch_token(4, 1))
    assert no_horizontal_overflow(page)
    for selector in ("#token-map", "#token-bars", "#token-colorbar"):
        box = page.locator(selector).bounding_box()
        assert box is not None, selector
        assert box["x"] >= 0, selector
        assert box["x"] + box["width"] <= 390, selector
    page.locator("#token-view").scroll_into_view_if_needed()
    watch.screenshot("token-view-390", element=page.locator("#layer-view"))
