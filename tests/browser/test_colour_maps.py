"""Colour maps, colour bars and focus in the inspector (issue "Inspector II").

A signed map (an attribution or a layer's output with values below 0) is drawn blue-white-red, symmetric about 0,
and over the image each pixel's opacity grows with |value|; a colour bar under each map or grid states the
normalisation in words with the API's own numbers at its ends; and the keyboard focus ring looks unlike a selection.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import pytest

from tests.browser.conftest import Watch
from tests.browser.inspector_page import no_horizontal_overflow, open_inspector, wait_layer, wait_pane
from tests.conftest import b64, sample_png
from tests.reliability.live_server import LiveServer

if TYPE_CHECKING:
    from numpy.typing import NDArray
    from playwright.sync_api import Page

DIGIT = 3
SIGNED_GRADIENT = f"model=lenet&sample=digit_{DIGIT}&method=gradient&a.abs=false"
RDBU = ["053061", "2166ac", "4393c3", "92c5de", "d1e5f0", "f7f7f7", "fddbc7", "f4a582", "d6604d", "b2182b", "67001f"]
BAR = re.compile(r"(?P<how>.+): (?P<lo>\S+) … (?P<hi>\S+)")


def saliency(server: LiveServer, **fields: Any) -> dict[str, Any]:
    """The API's first result for the sample digit (JSON tensors)."""
    body = {"model": "lenet", "inputs": [{"image": b64(sample_png(DIGIT))}], **fields}
    answer = httpx.post(f"{server.base_url}/saliency", json=body, timeout=120)
    assert answer.status_code == 200, answer.text[:300]
    result: dict[str, Any] = answer.json()["results"][0]
    return result


def conv1_output(server: LiveServer) -> NDArray[np.float64]:
    """lenet's conv1 output for the sample digit, `[C, h, w]`."""
    body = {"model": "lenet", "inputs": [{"image": b64(sample_png(DIGIT))}], "layers": ["conv1"]}
    answer = httpx.post(f"{server.base_url}/activations", json=body, timeout=60).json()
    payload = answer["activations"]["conv1"]["output"]
    values: NDArray[np.float64] = np.asarray(payload["data"], dtype=np.float64).reshape(payload["shape"])[0]
    return values


def strongest_channel(attribution: dict[str, Any]) -> NDArray[np.float64]:
    """`[..., h, w]` as one `[h, w]` map: at each pixel the value of largest magnitude, its sign kept."""
    values = np.asarray(attribution["data"], dtype=np.float64).reshape(attribution["shape"])
    if values.ndim == 2:
        return values
    planes = values.reshape(-1, *values.shape[-2:])
    pick = np.abs(planes).argmax(axis=0)
    picked: NDArray[np.float64] = np.take_along_axis(planes, pick[None], axis=0)[0]
    return picked


def diverging_rgba(values: NDArray[np.float64]) -> NDArray[np.float64]:
    """What the page should paint for a signed map over the image: RdBu (blue < 0 < red) from -max|v| to max|v|,
    opacity |v| / max|v|."""
    stops = np.array([[int(h[i : i + 2], 16) for i in (0, 2, 4)] for h in RDBU], dtype=np.float64)
    table = np.array([np.interp(np.linspace(0, 1, 256), np.linspace(0, 1, len(RDBU)), stops[:, c]) for c in range(3)])
    table = np.round(table.T)
    peak = float(np.abs(values).max())
    t = np.clip((values + peak) / (2 * peak), 0, 1)
    index = np.round(t * 255).astype(int)
    alpha = np.round(np.abs(t - 0.5) * 2 * 255)
    rgba: NDArray[np.float64] = np.concatenate([table[index], alpha[..., None]], axis=-1)
    return rgba


def canvas_rgba(page: Page, selector: str) -> NDArray[np.float64]:
    """The pixels of a canvas as `[h, w, 4]` (RGBA, not premultiplied)."""
    found: dict[str, Any] = page.eval_on_selector(
        selector,
        """c => ({w: c.width, h: c.height,
                  d: Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data)})""",
    )
    pixels: NDArray[np.float64] = np.asarray(found["d"], dtype=np.float64).reshape(found["h"], found["w"], 4)
    return pixels


def bar_ends(page: Page, selector: str) -> tuple[str, float, float]:
    """A colour bar's words and its two numbers as written (a real minus sign read as '-')."""
    text = page.inner_text(f"{selector} .colorbar-text")
    found = BAR.fullmatch(text.strip())
    assert found, text
    lo, hi = (float(found.group(k).replace("\u2212", "-")) for k in ("lo", "hi"))
    return found.group("how"), lo, hi


def close(shown: tuple[float, float], expected: tuple[float, float]) -> bool:
    """Both ends equal within the bar's formatting (3 significant digits)."""
    return all(math.isclose(a, b, rel_tol=5e-3, abs_tol=1e-9) for a, b in zip(shown, expected, strict=True))


def expected_bar(values: NDArray[np.float64]) -> tuple[str, float, float]:
    """The kind of scale and its ends for `values`: symmetric about 0 (±max|v|) if any is below 0, else min–max."""
    if float(values.min()) < 0:
        peak = float(np.abs(values).max())
        return "diverging", -peak, peak
    return "sequential", float(values.min()), float(values.max())


def test_a_signed_attribution_is_drawn_blue_below_zero_red_above_and_clear_at_zero(
    watch: Watch, server: LiveServer
) -> None:
    page = watch.page
    open_inspector(page, SIGNED_GRADIENT)
    wait_pane(page, "a", "gradient")
    assert page.is_checked("#a-abs") is False
    result = saliency(server, method="gradient", abs=False)
    signed = strongest_channel(result["attribution"])
    peak = float(np.abs(signed).max())
    assert signed.min() < 0 < signed.max(), "the signed gradient should have both signs"
    shown = canvas_rgba(page, "#pane-a canvas.heat")
    assert shown.shape[:2] == signed.shape
    expected = diverging_rgba(signed)

    negative, positive = signed < -0.4 * peak, signed > 0.4 * peak
    assert negative.any()
    assert positive.any()
    r, b, alpha = shown[..., 0], shown[..., 2], shown[..., 3]
    assert (b[negative] > r[negative] + 60).all(), "strongly negative pixels should be blue"
    assert (r[positive] > b[positive] + 60).all(), "strongly positive pixels should be red"
    assert (alpha[negative | positive] > 100).all()
    near_zero = np.abs(signed) < 0.02 * peak
    assert near_zero.any()
    assert (alpha[near_zero] <= 6).all(), "values near 0 should let the image through"
    np.testing.assert_allclose(alpha, expected[..., 3], atol=2)  # opacity grows with |value|
    opaque = alpha >= 64  # below, the canvas' premultiplied storage rounds the colour off
    np.testing.assert_allclose(shown[..., :3][opaque], expected[..., :3][opaque], atol=6)
    assert "red: positive attribution, blue: negative" in (page.get_attribute("#pane-a .stack", "aria-label") or "")


def test_the_colour_bars_state_the_normalisation_with_the_apis_ends(watch: Watch, server: LiveServer) -> None:
    page = watch.page
    open_inspector(page, f"{SIGNED_GRADIENT}&method2=gradient&layer=conv1")  # right: |gradient|, the default
    wait_pane(page, "a", "gradient")
    wait_pane(page, "b", "gradient")
    wait_layer(page)

    signed = strongest_channel(saliency(server, method="gradient", abs=False)["attribution"])
    how, lo, hi = bar_ends(page, "#a-colorbar")
    assert how == "per-map, symmetric about 0"
    peak = float(np.abs(signed).max())
    assert close((lo, hi), (-peak, peak)), (lo, hi, peak)
    assert page.get_attribute("#a-colorbar", "data-kind") == "diverging"
    assert math.isclose(float(page.get_attribute("#a-colorbar", "data-hi") or "nan"), peak, rel_tol=1e-6)
    assert "blue below 0, white at 0, red above" in page.inner_text("#a-colorbar .colorbar-note")
    assert page.get_attribute("#pane-a .stack", "aria-describedby") == "a-colorbar"

    magnitude = strongest_channel(saliency(server, method="gradient")["attribution"])
    assert expected_bar(magnitude)[0] == "sequential"
    how, lo, hi = bar_ends(page, "#b-colorbar")
    assert how == "per-map min–max"
    want = (float(magnitude.min()), float(magnitude.max()))
    assert close((lo, hi), want), (lo, hi, want)
    assert want[1] > want[0]
    assert page.get_attribute("#b-colorbar", "data-kind") == "sequential"

    maps = conv1_output(server)
    assert page.input_value("#grid-scale") == "channel"
    words = page.inner_text("#grid-colorbar .colorbar-text")  # every tile has its own ends: words, not numbers
    kind, _, _ = expected_bar(maps)
    assert words.startswith("per-channel, symmetric about 0: " if kind == "diverging" else "per-channel min–max: ")
    page.fill("#channel", "2")
    page.dispatch_event("#channel", "change")
    own = float(np.abs(maps[2]).max())  # on its own scale: ±its max |v| in a signed grid, else its min–max
    want = (-own, own) if kind == "diverging" else (float(maps[2].min()), float(maps[2].max()))
    how, lo, hi = bar_ends(page, "#channel-colorbar")
    assert how.startswith("channel 2, own scale"), how
    assert close((lo, hi), want), (lo, hi, want)

    page.select_option("#grid-scale", "shared")
    page.wait_for_selector('#grid-figure[data-scale="shared"]')
    kind, want_lo, want_hi = expected_bar(maps)
    how, lo, hi = bar_ends(page, "#grid-colorbar")
    assert how == f"shared scale across channels, {'symmetric about 0' if kind == 'diverging' else 'min–max'}"
    assert close((lo, hi), (want_lo, want_hi)), (lo, hi, want_lo, want_hi)
    assert bar_ends(page, "#channel-colorbar")[1:] == (lo, hi)  # the enlarged channel is on the shared scale too
    assert "shared by the channels" in (page.get_attribute("#grid", "alt") or "")
    assert "scale=shared" in page.url


@pytest.mark.parametrize(("width", "height"), [(1280, 800), (390, 844)])
def test_the_colour_bars_fit_the_screen(watch: Watch, width: int, height: int) -> None:
    page = watch.page
    page.set_viewport_size({"width": width, "height": height})
    open_inspector(page, f"{SIGNED_GRADIENT}&layer=conv1&scale=shared")
    wait_pane(page, "a", "gradient")
    wait_pane(page, "b", "gradcam")
    wait_layer(page)
    assert no_horizontal_overflow(page)
    for bar in ("#a-colorbar", "#b-colorbar", "#grid-colorbar", "#channel-colorbar"):
        found = page.locator(bar).bounding_box()
        assert found is not None, f"{bar} is not shown"
        assert found["x"] >= 0, (bar, found)
        assert found["x"] + found["width"] <= width, (bar, found)
        assert found["width"] >= 120, (bar, found)  # wide enough to read the ramp
    watch.screenshot(f"colour-bar-saliency-{width}", element=page.locator("#saliency-panel"))
    watch.screenshot(f"colour-bar-grid-{width}", element=page.locator("#layer-view"))


def styles(page: Page, selector: str) -> dict[str, str]:
    found: dict[str, str] = page.eval_on_selector(
        selector,
        """n => { const s = getComputedStyle(n);
            return {outlineStyle: s.outlineStyle, outlineColor: s.outlineColor, outlineWidth: s.outlineWidth,
                    background: s.backgroundColor, border: s.borderTopColor,
                    focusVisible: String(n.matches(':focus-visible'))}; }""",
    )
    return found


def test_keyboard_focus_looks_unlike_a_selection(watch: Watch) -> None:
    """A focused, unselected tree row or sample digit gets a ring in neither selection colour (the tree's blue, the
    sample's amber); a focused selected row keeps its fill and gets the ring too."""
    page = watch.page
    open_inspector(page, f"model=lenet&sample=digit_{DIGIT}&layer=conv1")
    wait_layer(page)
    selected_row = '#tree-body .tree-row[data-layer="conv1"] .pick'
    selected_sample = f'.sample[data-sample="digit_{DIGIT}"]'
    page.wait_for_selector(f'{selected_sample}[aria-pressed="true"]')
    row = styles(page, selected_row)
    sample = styles(page, selected_sample)
    selection_colours = {row["background"], sample["border"]}

    page.focus(selected_row)
    page.keyboard.press("Tab")  # the next row's pick: focused, not selected
    assert page.evaluate("document.activeElement.closest('.tree-row:not(.selected)') !== null")
    focused = styles(page, "#tree-body .pick:focus")
    assert focused["focusVisible"] == "true"
    assert focused["outlineStyle"] not in ("none", "solid"), focused  # a ring drawn unlike a solid selection mark
    assert float(focused["outlineWidth"].removesuffix("px")) >= 2
    assert focused["outlineColor"] not in selection_colours, (focused, selection_colours)
    assert focused["background"] != row["background"]
    watch.screenshot("focus-apart-from-selection-tree", element=page.locator("#tree"))

    page.keyboard.press("Shift+Tab")  # back to the selected row: its fill stays, and the ring shows on it
    both = styles(page, selected_row)
    assert both["focusVisible"] == "true"
    assert both["background"] == row["background"]
    assert both["outlineStyle"] == focused["outlineStyle"]
    assert both["outlineColor"] != both["background"]

    page.focus(selected_sample)
    page.keyboard.press("Tab")  # the next digit: focused, not selected
    assert page.evaluate("document.activeElement.getAttribute('aria-pressed') === 'false'")
    other = styles(page, ".sample:focus")
    assert other["focusVisible"] == "true"
    assert other["outlineStyle"] == focused["outlineStyle"]
    assert other["outlineColor"] not in selection_colours, (other, selection_colours)
    assert other["border"] != sample["border"]
    watch.screenshot("focus-apart-from-selection-samples", element=page.locator("#input-panel"))
