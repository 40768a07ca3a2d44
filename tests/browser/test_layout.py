"""The whole view at 1280 and 1024 px wide: nothing spills sideways, panes sit side by side; the README picture;
at a phone's 390 px the page scrolls only down."""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

import pytest
from PIL import Image

from tests.browser.conftest import ARTIFACTS, Watch
from tests.browser.inspector_page import no_horizontal_overflow, open_inspector, wait_layer, wait_pane, wait_prediction
from tests.reliability.live_server import REPO_ROOT

if TYPE_CHECKING:
    from playwright.sync_api import FloatRect, Page

README_PICTURE = REPO_ROOT / "docs" / "inspector.png"
UPDATE_ENV = "HOOKSERVE_UPDATE_SCREENSHOT"  # 1: the suite also refreshes docs/inspector.png
README_SCALE = 0.75  # the picture is 960 px wide
FULL_VIEW = "model=lenet&sample=digit_7&layer=conv1"


def box(page: Page, selector: str) -> FloatRect:
    found = page.locator(selector).bounding_box()
    assert found is not None, f"{selector} is not shown"
    return found


def side_by_side(page: Page, left: str, right: str) -> bool:
    a, b = box(page, left), box(page, right)
    return abs(a["y"] - b["y"]) < 2 and a["x"] + a["width"] <= b["x"]


def spills(page: Page) -> list[str]:
    """Panels whose content reaches past their right edge (scrolling boxes excepted)."""
    found: list[str] = page.evaluate(
        """() => {
            const out = [];
            const SCROLLERS = '.scroll, pre, .tree, table.stats, .sr-only';
            for (const panel of document.querySelectorAll('.panel')) {
                const edge = panel.getBoundingClientRect().right + 1;
                for (const node of panel.querySelectorAll('*')) {
                    if (node.closest(SCROLLERS) || !node.getClientRects().length) continue;
                    const right = node.getBoundingClientRect().right;
                    if (right > edge) out.push(`${panel.id} > ${node.tagName}.${node.className}`);
                }
            }
            return out;
        }"""
    )
    return found


@pytest.mark.parametrize("width", [1280, 1024])
def test_the_full_view_fits_the_width(watch: Watch, width: int) -> None:
    page = watch.page
    page.set_viewport_size({"width": width, "height": 900})
    open_inspector(page, FULL_VIEW)
    wait_prediction(page)
    wait_layer(page)
    wait_pane(page, "a", "gradient")
    wait_pane(page, "b", "gradcam")
    assert no_horizontal_overflow(page)
    assert spills(page) == []
    assert side_by_side(page, ".sidebar", ".content")
    assert side_by_side(page, "#tree", "#layer-view")
    assert side_by_side(page, "#pane-a", "#pane-b")
    assert box(page, "#pane-a .stack")["width"] >= 200
    watch.screenshot(f"inspector-{width}")
    if width == 1280:
        save_readme_picture(page)


def test_a_phone_scrolls_only_down(watch: Watch) -> None:
    """At 390 x 844 the top bar wraps instead of widening the page, and the summary's totals keep their numbers on
    a line (not one character per line in a squeezed column)."""
    page = watch.page
    page.set_viewport_size({"width": 390, "height": 844})
    open_inspector(page, FULL_VIEW)
    wait_prediction(page)
    wait_layer(page)
    page.locator("dl.totals dd").first.wait_for()
    assert no_horizontal_overflow(page), page.evaluate("document.documentElement.scrollWidth")
    assert box(page, ".topbar")["width"] <= 390
    lines = page.eval_on_selector_all(
        "dl.totals dd",
        "ds => ds.map(d => { const r = document.createRange(); r.selectNodeContents(d);"
        " return r.getClientRects().length; })",
    )
    assert lines, "no totals shown"
    assert max(lines) == 1, lines  # line boxes of each value's text
    watch.screenshot("inspector-390")


def save_readme_picture(page: Page) -> None:
    """The page down to the saliency panes as a small 256-colour PNG (into docs/ on HOOKSERVE_UPDATE_SCREENSHOT=1)."""
    raw = ARTIFACTS / "inspector-readme-raw.png"
    page.screenshot(path=str(raw), full_page=True)
    saliency = box(page, "#saliency-panel")
    bottom = int(saliency["y"] + saliency["height"] + page.evaluate("window.scrollY") + 16)
    small = ARTIFACTS / "inspector-readme.png"
    with Image.open(raw) as image:
        cropped = image.convert("RGB").crop((0, 0, image.width, min(bottom, image.height)))
        size = (round(cropped.width * README_SCALE), round(cropped.height * README_SCALE))
        resized = cropped.resize(size, Image.Resampling.LANCZOS)
        resized.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(small, optimize=True)
    if os.environ.get(UPDATE_ENV) == "1":
        shutil.copyfile(small, README_PICTURE)
