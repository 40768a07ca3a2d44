"""Every view of the inspector, one after another, at a desktop's 1280 px and a phone's 390 px: a screenshot of each
view at both widths, and a phone layout without sideways scroll.

For each view the test checks that its element is shown with a size, that the page does not scroll sideways while it
is open, and that nothing of the view reaches past the viewport's edges (boxes that scroll or clip their content
excepted), then saves `tests/artifacts/browser/gallery-<view>-<width>.png` for a person to look at. The cheapest
models and methods: lenet (the CNN views), vit_digits (token and attention views), /docs last.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.browser.conftest import Watch
from tests.browser.inspector_page import (
    image_stats,
    no_horizontal_overflow,
    open_inspector,
    select_layer,
    wait_layer,
    wait_pane,
    wait_prediction,
)
from tests.browser.test_attention_view import wait_attention
from tests.browser.test_token_view import patch_token, wait_tokens

if TYPE_CHECKING:
    from playwright.sync_api import Page

HEIGHTS = {1280: 900, 390: 844}  # as test_layout and test_colour_maps size them
LENET = "model=lenet&sample=digit_7&layer=conv1"
TOKEN = patch_token(3, 5)
VIT = f"model=vit_digits&sample=digit_7&layer=blocks.3&token={TOKEN}"

# Elements of a view that reach past the viewport's left or right edge, except those inside a box (of the view) that
# scrolls or clips them: `tag#id.class left..right`.
OUTSIDE = """(root) => {
    const limit = window.innerWidth;
    const clipped = (node) => {
        for (let n = node.parentElement; n; n = n.parentElement) {
            if (getComputedStyle(n).overflowX !== 'visible') return true;
            if (n === root) return false;
        }
        return false;
    };
    const name = (n) => `${n.tagName.toLowerCase()}${n.id ? '#' + n.id : ''}`
        + (typeof n.className === 'string' && n.className ? '.' + n.className.trim().split(/\\s+/).join('.') : '');
    const out = [];
    for (const node of [root, ...root.querySelectorAll('*')]) {
        if (!node.getClientRects().length) continue;
        const r = node.getBoundingClientRect();
        if (r.width === 0 && r.height === 0) continue;
        if ((r.right > limit + 0.5 || r.left < -0.5) && (node === root || !clipped(node))) {
            out.push(`${name(node)} ${Math.round(r.left)}..${Math.round(r.right)}`);
        }
    }
    return out;
}"""


def lines(page: Page, selector: str) -> list[int]:
    """How many line boxes the text of each matching element takes (2 for "100.0 %" wrapped under itself)."""
    found: list[int] = page.eval_on_selector_all(
        selector,
        "cells => cells.map(c => { const r = document.createRange(); r.selectNodeContents(c);"
        " return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size; })",
    )
    return found


def outside(page: Page, selector: str) -> list[str]:
    found: list[str] = page.eval_on_selector(selector, OUTSIDE)
    return found


def shown(watch: Watch, view: str, selector: str, width: int, *, element: bool = True) -> None:
    """The view's element is shown with a size, the page does not scroll sideways and nothing of the view is past
    the viewport's edges; then its screenshot (the element, or the viewport for a page of its own)."""
    page = watch.page
    node = page.locator(selector)
    node.scroll_into_view_if_needed()
    assert node.is_visible(), f"{view}: {selector} is not shown"
    box = node.bounding_box()
    assert box is not None, f"{view}: {selector} has no box"
    assert box["width"] > 0, (view, box)
    assert box["height"] > 0, (view, box)
    assert no_horizontal_overflow(page), (view, page.evaluate("document.documentElement.scrollWidth"))
    assert outside(page, selector) == [], view
    if element:
        watch.screenshot(f"gallery-{view}-{width}", element=node)
    else:
        watch.screenshot(f"gallery-{view}-{width}", full_page=False)


@pytest.mark.parametrize("width", sorted(HEIGHTS, reverse=True))
def test_every_view_fits_the_width(watch: Watch, width: int) -> None:
    page = watch.page
    page.set_viewport_size({"width": width, "height": HEIGHTS[width]})

    open_inspector(page, LENET)
    rows = wait_prediction(page)
    assert len(rows) == 5
    assert rows[0].label == "7"
    assert lines(page, "#topk-table td.value") == [1] * 5
    shown(watch, "topk", "#predict-panel", width)

    wait_pane(page, "a", "gradient")
    wait_pane(page, "b", "gradcam")
    assert image_stats(page, "#pane-a canvas.heat")["std"] > 0  # a map, not a blank
    shown(watch, "saliency", "#saliency-panel", width)

    wait_layer(page)
    assert page.is_visible("#grid-figure")
    assert image_stats(page, "#grid")["std"] > 10, "the feature-map grid is blank"
    shown(watch, "feature-grid", "#layer-view", width)

    page.click("#act-histogram-button")
    page.wait_for_selector('#act-histogram[data-key="conv1"]:not([hidden])')
    assert "4,704 values" in page.inner_text("#act-histogram-caption")
    shown(watch, "act-histogram", "#layer-view", width)

    page.click("#sweep-run")
    page.wait_for_selector("#sweep-table:not([hidden])")
    assert page.locator("#sweep-table tbody tr").count() == 6  # conv1's channels
    page.click("#sweep-table tbody tr:first-child button.sweep-off")
    page.click("#edit-form button[type=submit]")
    page.wait_for_selector("#edit-edited:not([hidden])")
    page.wait_for_selector('#interventions-panel[aria-busy="false"]')
    assert page.locator("#edit-edited tbody tr").count() > 0
    values = lines(page, "#interventions-panel .compare td.value, #interventions-panel .compare td.delta")
    assert values, "no clean or edited top-k"
    assert max(values) == 1, values  # each probability and change on one line, not wrapped in a squeezed column
    shown(watch, "interventions", "#interventions-panel", width)

    page.click("#graph-details > summary")
    page.wait_for_selector("#graph-box[data-nodes]")
    assert page.locator("#graph-box .graph-row").count() == int(page.get_attribute("#graph-box", "data-nodes") or "0")
    shown(watch, "graph", "#graph-details", width)

    page.wait_for_selector("#state-box table tbody tr")
    page.click('#state-box tr[data-key="conv1.weight"] button.hist')
    page.wait_for_selector('#state-histogram[data-key="conv1.weight"]:not([hidden])')
    assert "no NaN or Inf" in page.inner_text("#state-box .verdict")
    page.eval_on_selector("#state-box .scroll", "box => { box.scrollLeft = 0; }")  # the click scrolled it to the button
    shown(watch, "model-card", "#card-panel", width)

    select_layer(page, "fc1")
    page.wait_for_selector('#vector-canvas[data-units="120"]')
    assert page.is_visible("#vector-figure")
    assert image_stats(page, "#vector-canvas")["std"] > 10  # bars, not a blank box
    shown(watch, "bars", "#layer-view", width)

    open_inspector(page, VIT)
    wait_tokens(page, TOKEN)
    assert page.locator("#token-grid .token-cell").count() == 64
    assert page.is_visible("#token-detail")
    shown(watch, "tokens", "#layer-view", width)

    wait_attention(page)
    assert page.locator("#attention-heads .head-tile").count() == 4
    for method in ("attention_rollout", "gradient_weighted_attention"):
        page.wait_for_selector(f'#attention-relevance figure[data-method="{method}"][data-state="done"]')
    shown(watch, "attention", "#attention-panel", width)

    page.goto("/docs")
    page.wait_for_selector(".opblock")
    assert page.locator(".opblock").count() > 10
    shown(watch, "docs", "#swagger-ui", width, element=False)
