"""The inspector's attention view on the digits ViT in headless Chromium: the class token's attention over the
image, a clicked patch's, one head or their mean, every head as small multiples, and attention rollout beside
gradient-weighted attention; each map drawn equals the API's numbers. Screenshots in tests/artifacts/browser/."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import numpy as np

from tests.browser.conftest import Watch
from tests.browser.inspector_page import image_stats, open_inspector, pick_sample
from tests.conftest import b64, sample_png
from tests.reliability.live_server import LiveServer

if TYPE_CHECKING:
    from playwright.sync_api import Page

BLOCK = "blocks.3.attn"  # the panel opens on the last block


def api_maps(server: LiveServer, block: str) -> np.ndarray:
    """The API's probabilities of one block for the sample 7, every query row: `[heads, T, T]`."""
    body = {"model": "vit_digits", "inputs": [{"image": b64(sample_png(7))}], "blocks": [block], "queries": "all"}
    answer = httpx.post(f"{server.base_url}/attention", json=body, timeout=60).json()
    payload = answer["attention"][block]
    maps: np.ndarray = np.asarray(payload["data"], dtype=np.float32).reshape(payload["shape"])[0]
    return maps


def drawn(page: Page) -> np.ndarray:
    return np.asarray(page.evaluate("window.hookserveInspector.attention.drawn()"), dtype=np.float32)


def wait_attention(page: Page) -> None:
    page.wait_for_selector('#attention-panel[data-state="done"][aria-busy="false"]', timeout=120_000)


def test_the_class_token_a_clicked_patch_and_each_head_over_the_digit(watch: Watch, server: LiveServer) -> None:
    page = watch.page
    open_inspector(page, "model=vit_digits")
    assert page.is_visible("#attention-panel")
    pick_sample(page, "digit_7")
    wait_attention(page)
    maps = api_maps(server, BLOCK)
    np.testing.assert_allclose(drawn(page), maps[:, 0, 1:].mean(axis=0), rtol=1e-5, atol=1e-7)  # cls, mean of heads
    assert page.eval_on_selector_all("#attention-heads .head-tile", "tiles => tiles.length") == 4
    for figure in ("attention_rollout", "gradient_weighted_attention"):
        page.wait_for_selector(f'#attention-relevance figure[data-method="{figure}"][data-state="done"]')
        heat = image_stats(page, f'#attention-relevance figure[data-method="{figure}"] canvas.heat')
        assert (heat["width"], heat["height"]) == (8, 8)
        assert heat["std"] > 0  # a map, not a blank
    watch.screenshot("attention-vit-digits-cls", element=page.locator("#attention-panel"))

    box = page.locator("#attention-stack").bounding_box()
    assert box is not None
    page.mouse.click(box["x"] + box["width"] * (5.5 / 8), box["y"] + box["height"] * (3.5 / 8))  # patch row 3, col 5
    query = 1 + 3 * 8 + 5
    page.wait_for_selector(f'#attention-panel[data-query="{query}"]')
    np.testing.assert_allclose(drawn(page), maps[:, query, 1:].mean(axis=0), rtol=1e-5, atol=1e-7)
    assert "query=30" in page.url
    assert "patch (3, 5)" in page.inner_text("#attention-caption")

    page.click("#attention-heads .head-tile:nth-child(3)")  # head 2
    page.wait_for_selector('#attention-heads .head-tile:nth-child(3)[aria-pressed="true"]')
    assert page.input_value("#attention-head") == "2"
    np.testing.assert_allclose(drawn(page), maps[2, query, 1:], rtol=1e-5, atol=1e-7)
    page.focus("#attention-stack")
    page.keyboard.press("ArrowLeft")
    page.wait_for_selector(f'#attention-panel[data-query="{query - 1}"]')
    watch.screenshot("attention-vit-digits-patch-head2", element=page.locator("#attention-panel"))
    page.keyboard.press("Escape")
    page.wait_for_selector('#attention-panel[data-query="0"]')

    page.select_option("#attention-block", "blocks.0.attn")
    wait_attention(page)
    np.testing.assert_allclose(drawn(page), api_maps(server, "blocks.0.attn")[2, 0, 1:], rtol=1e-5, atol=1e-7)
    assert "block=blocks.0.attn" in page.url


def test_the_view_comes_back_from_its_url_and_hides_for_a_cnn(watch: Watch, server: LiveServer) -> None:
    page = watch.page
    open_inspector(page, "model=vit_digits&sample=digit_7&block=blocks.1.attn&head=1&query=12")
    wait_attention(page)
    assert page.input_value("#attention-block") == "blocks.1.attn"
    np.testing.assert_allclose(drawn(page), api_maps(server, "blocks.1.attn")[1, 12, 1:], rtol=1e-5, atol=1e-7)
    page.select_option("#model", "lenet")
    page.wait_for_selector("#attention-panel", state="hidden")
