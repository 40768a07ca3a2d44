"""The inspector (/ui) driven in headless Chromium against a live server: the flows of issue 15.

Every test gets a fresh page; the `watch` fixture fails it on a console error it did not expect
and on any request that leaves loopback. Screenshots land in tests/artifacts/browser/.
"""

from __future__ import annotations

import io
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import httpx
import numpy as np
import pytest
from PIL import Image
from skimage import data as skdata

from tests.browser.conftest import Watch
from tests.browser.inspector_page import (
    choose_method,
    heat_pixels,
    image_stats,
    open_inspector,
    pick_sample,
    select_layer,
    wait_layer,
    wait_pane,
    wait_prediction,
)
from tests.browser.test_schema_shapes import union_methods
from tests.conftest import b64, sample_png
from tests.reliability.live_server import LiveServer

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM_422 = r"Failed to load resource: the server responded with a status of 422"


@pytest.fixture(scope="module")
def cat_jpeg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scikit-image's cat (Chelsea) as a JPEG file, as a user would pick it."""
    path = tmp_path_factory.mktemp("images") / "chelsea.jpg"
    pixels: np.ndarray[Any, Any] = skdata.chelsea()
    Image.fromarray(pixels).save(path, format="JPEG", quality=90)
    return path


def query(page: Page) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(page.url).query).items()}


def test_cat_jpeg_on_resnet18_shows_the_apis_top_k(watch: Watch, server: LiveServer, cat_jpeg: Path) -> None:
    page = watch.page
    open_inspector(page, "model=resnet18")
    page.set_input_files("#file", str(cat_jpeg))
    shown = wait_prediction(page)
    files = {"image": ("chelsea.jpg", cat_jpeg.read_bytes(), "image/jpeg")}
    answer = httpx.post(f"{server.base_url}/predict", data={"model": "resnet18", "top_k": "5"}, files=files, timeout=60)
    expected = answer.json()["predictions"][0]["top_k"]
    assert [r.index for r in shown] == [c["index"] for c in expected]
    assert [r.label for r in shown] == [c["label"] for c in expected]
    for row, c in zip(shown, expected, strict=True):
        assert math.isclose(row.score, c["score"], rel_tol=1e-5, abs_tol=1e-7)
    assert page.is_visible("#preview-figure")
    assert "chelsea.jpg" in (page.get_attribute("#preview", "aria-label") or "")
    watch.screenshot("cat-resnet18-topk")


@pytest.mark.parametrize("digit", [3, 7])
def test_sample_digit_on_lenet_puts_that_digit_on_top(watch: Watch, digit: int) -> None:
    page = watch.page
    open_inspector(page, "model=lenet")
    pick_sample(page, f"digit_{digit}")
    rows = wait_prediction(page)
    assert rows[0].label == str(digit)
    assert rows[0].score > 0.9
    assert page.inner_text("#topk-table tbody tr.top th") == str(digit)
    assert query(page)["sample"] == f"digit_{digit}"
    watch.screenshot(f"lenet-digit-{digit}")


def test_conv1_shows_a_non_blank_grid_and_enlarges_a_channel(watch: Watch) -> None:
    page = watch.page
    open_inspector(page, "model=lenet")
    pick_sample(page, "digit_2")
    select_layer(page, "conv1")
    grid = image_stats(page, "#grid")
    assert grid["width"] > 32
    assert grid["height"] > 32
    assert grid["std"] > 10, "the feature-map grid is blank"
    assert page.get_attribute("#grid", "alt") == "Feature maps of conv1: 6 of 6 channels, each scaled to its own range"
    assert page.inner_text("#layer-stats tbody th") == "conv1"
    assert len(page.query_selector_all("#layer-stats tbody td")) == 5  # min, max, mean, std, zeros
    box = page.locator("#grid").bounding_box()
    assert box is not None
    page.mouse.click(box["x"] + box["width"] * 0.9, box["y"] + box["height"] * 0.9)  # the last tile: channel 5
    page.wait_for_function("document.querySelector('#channel').value === '5'")
    assert page.get_attribute("#channel-canvas", "aria-label") == "Channel 5 of conv1, enlarged"
    assert image_stats(page, "#channel-canvas")["std"] > 10
    assert query(page)["layer"] == "conv1"
    watch.screenshot("lenet-conv1-grid")
    page.click('#tree-body .tree-row[data-layer=""] .toggle')  # collapse the model: only its row stays
    assert page.locator("#tree-body .tree-row").count() == 1
    page.click('#tree-body .tree-row[data-layer=""] .toggle')
    assert page.locator("#tree-body .tree-row").count() == 8


def test_switching_saliency_methods_changes_the_overlay(watch: Watch, server: LiveServer) -> None:
    page = watch.page
    open_inspector(page, "model=lenet")
    pick_sample(page, "digit_5")
    wait_pane(page, "a", "gradient")
    wait_pane(page, "b", "gradcam")
    offered = page.eval_on_selector_all("#a-method option", "options => options.map(o => o.value)")
    schema = httpx.get(f"{server.base_url}/openapi.json", timeout=30).json()
    assert offered == union_methods(schema)
    before = heat_pixels(page, "a")
    assert before != heat_pixels(page, "b")
    assert page.locator("#a-steps").count() == 0  # integrated_gradients' field is not on the gradient form
    choose_method(page, "a", "integrated_gradients")
    wait_pane(page, "a", "integrated_gradients")
    assert page.locator("#a-steps").input_value() == "50"
    assert heat_pixels(page, "a") != before
    assert "convergence" in page.inner_text("#pane-a figcaption")
    assert query(page)["method"] == "integrated_gradients"
    page.fill("#opacity", "100")  # the slider only changes how the overlay is blended
    assert page.eval_on_selector("#pane-a canvas.heat", "c => getComputedStyle(c).opacity") == "1"
    watch.screenshot("lenet-saliency-switch")


def test_a_parameter_error_shows_its_detail_next_to_the_field(watch: Watch, server: LiveServer) -> None:
    watch.allow(CHROMIUM_422)
    page = watch.page
    open_inspector(page, "model=lenet&method=integrated_gradients")
    pick_sample(page, "digit_1")
    wait_pane(page, "a", "integrated_gradients")
    page.fill("#a-steps", "100000")
    page.press("#a-steps", "Enter")
    page.wait_for_selector("#a-steps-error:not([hidden])")
    assert "over the limit" in page.inner_text("#a-steps-error")
    assert "max_ig_steps" in page.inner_text("#a-steps-error")


def test_an_unknown_layer_filter_shows_the_apis_422_detail(watch: Watch, server: LiveServer) -> None:
    watch.allow(CHROMIUM_422)
    page = watch.page
    open_inspector(page, "model=resnet18")
    page.fill("#filter", "layer9.*")
    page.press("#filter", "Enter")
    page.wait_for_selector("#filter-error:not([hidden])")
    zeros = {"tensor": {"shape": [3, 224, 224], "dtype": "float32", "b64": b64(bytes(3 * 224 * 224 * 4))}}
    body = {"model": "resnet18", "inputs": [zeros], "layers": ["layer9.*"], "format": "stats"}
    answer = httpx.post(f"{server.base_url}/activations", json=body, timeout=60)
    assert answer.status_code == 422
    assert page.inner_text("#filter-error") == f"422: {answer.json()['detail']}"
    assert page.locator("#tree-body .tree-row").count() == 0
    watch.screenshot("resnet18-unknown-filter")
    page.fill("#filter", "layer1.*.conv*")
    page.press("#filter", "Enter")
    page.wait_for_selector('#layers-panel[aria-busy="false"]')
    assert page.is_hidden("#filter-error")
    shown = page.eval_on_selector_all("#tree-body .tree-row:not(.context)", "rows => rows.map(r => r.dataset.layer)")
    assert shown == ["layer1.0.conv1", "layer1.0.conv2", "layer1.1.conv1", "layer1.1.conv2"]
    assert page.inner_text("#filter-status") == "4 layers match"


def test_the_url_restores_the_same_view_after_a_reload(watch: Watch) -> None:
    page = watch.page
    open_inspector(page, "model=lenet")
    pick_sample(page, "digit_4")
    wait_prediction(page)
    select_layer(page, "conv2")
    page.select_option("#target", index=2)  # the second class of the top-k
    target = page.eval_on_selector("#target", "s => s.value")
    choose_method(page, "b", "smoothgrad")
    wait_pane(page, "b", "smoothgrad")
    page.fill("#b-samples", "8")  # a method setting, the overlay, top-k and the enlarged channel are kept too
    page.dispatch_event("#b-samples", "change")
    page.click("#pane-b button.run")
    page.wait_for_selector('#pane-b[data-state="running"]', state="detached")
    wait_pane(page, "b", "smoothgrad")
    wait_pane(page, "a", "gradient")
    page.fill("#opacity", "30")
    page.dispatch_event("#opacity", "change")
    page.fill("#topk", "3")
    page.click("#topk-form button[type=submit]")
    page.wait_for_function("() => document.querySelectorAll('#topk-table tbody tr').length === 3")
    page.fill("#channel", "5")
    page.dispatch_event("#channel", "change")
    before = {
        "url": page.url,
        "heat_a": heat_pixels(page, "a"),
        "heat_b": heat_pixels(page, "b"),
        "grid": page.get_attribute("#grid", "alt"),
    }
    assert query(page) == {
        "model": "lenet",
        "sample": "digit_4",
        "layer": "conv2",
        "target": target,
        "method2": "smoothgrad",
        "b.samples": "8",
        "opacity": "30",
        "topk": "3",
        "channel": "5",
    }
    page.reload()
    wait_layer(page)
    wait_pane(page, "a", "gradient")
    wait_pane(page, "b", "smoothgrad")
    wait_prediction(page)
    assert page.url == before["url"]
    assert page.eval_on_selector("#model", "s => s.value") == "lenet"
    assert page.get_attribute('.sample[data-sample="digit_4"]', "aria-pressed") == "true"
    assert page.get_attribute('#tree-body .tree-row[data-layer="conv2"] .pick', "aria-pressed") == "true"
    assert page.get_attribute("#grid", "alt") == before["grid"]
    assert page.eval_on_selector("#target", "s => s.value") == target
    assert page.get_attribute("#pane-a", "data-target") == target
    assert heat_pixels(page, "a") == before["heat_a"]
    assert heat_pixels(page, "b") == before["heat_b"]  # smoothgrad is seeded: the same map again
    assert page.input_value("#b-samples") == "8"
    assert page.input_value("#opacity") == "30"
    assert page.locator("#topk-table tbody tr").count() == 3
    assert page.inner_text("#channel-caption") == "channel 5"
    choose_method(page, "b", "gradcam")  # another method: the old one's settings leave the URL
    assert "b.samples" not in query(page)
    watch.screenshot("lenet-restored-after-reload")


def test_a_link_naming_what_is_not_here_says_so(watch: Watch) -> None:
    """An unknown model or layer in a shared link, or a link made with an uploaded image: each said next to its
    control instead of a silently different view."""
    page = watch.page
    open_inspector(page, "model=lenet9&layer=conv1")
    page.wait_for_selector("#model-error:not([hidden])")
    assert "this link's model 'lenet9' is not served here" in page.inner_text("#model-error")
    open_inspector(page, "model=lenet&layer=conv9&input=upload")
    page.wait_for_selector("#layer-error:not([hidden])")
    assert "this link's layer 'conv9' is not a layer of lenet" in page.inner_text("#layer-error")
    page.wait_for_selector("#input-error:not([hidden])")
    assert "made with an uploaded image" in page.inner_text("#input-error")


def test_an_uploaded_image_survives_a_reload_of_the_tab(watch: Watch, tmp_path: Path) -> None:
    page = watch.page
    open_inspector(page, "model=lenet")
    upload = tmp_path / "my-digit.png"
    upload.write_bytes(sample_png(9))
    page.set_input_files("#file", str(upload))
    first = wait_prediction(page)
    assert first[0].label == "9"
    page.reload()
    assert wait_prediction(page) == first
    assert "my-digit.png" in page.inner_text("#preview-caption")


def test_drag_and_drop_gives_the_image(watch: Watch, cat_jpeg: Path) -> None:
    page = watch.page
    open_inspector(page, "model=lenet")
    buffer = io.BytesIO()
    Image.open(cat_jpeg).convert("L").resize((64, 48)).save(buffer, format="PNG")
    handle = page.evaluate_handle(
        """bytes => { const t = new DataTransfer();
            t.items.add(new File([new Uint8Array(bytes)], 'dropped.png', {type: 'image/png'})); return t; }""",
        list(buffer.getvalue()),
    )
    page.dispatch_event("#drop", "drop", {"dataTransfer": handle})
    assert len(wait_prediction(page)) == 5
    assert "dropped.png" in page.inner_text("#preview-caption")


def test_an_undecodable_file_shows_the_apis_400_next_to_the_input(watch: Watch, tmp_path: Path) -> None:
    watch.allow(r"Failed to load resource: the server responded with a status of 400")
    page = watch.page
    open_inspector(page, "model=lenet")
    bogus = tmp_path / "notes.png"
    bogus.write_bytes(b"this is not an image")
    page.set_input_files("#file", str(bogus))
    page.wait_for_selector("#input-error:not([hidden])")
    assert page.inner_text("#input-error").startswith("400: ")
    assert page.is_hidden("#topk-table")


def test_feature_ablation_sends_only_the_chosen_groups_fields(watch: Watch) -> None:
    """slic's fields (segments, compactness, sigma) and grid's (cell) show, and are sent, only with their choice:
    sent together the API refuses them, so grid never ran from the form as pre-filled."""
    page = watch.page
    open_inspector(page, "model=lenet")
    pick_sample(page, "digit_3")
    wait_pane(page, "a", "gradient")
    choose_method(page, "a", "feature_ablation")
    wait_pane(page, "a", "feature_ablation")
    assert page.is_visible("#a-segments")
    assert not page.is_visible("#a-cell")
    slic = heat_pixels(page, "a")
    page.select_option("#a-groups", "grid")
    assert page.is_visible("#a-cell")
    assert not page.is_visible("#a-segments")
    page.click("#pane-a button.run")
    page.wait_for_function("p => document.querySelector('#pane-a canvas.heat').toDataURL() !== p", arg=slic)
    wait_pane(page, "a", "feature_ablation")
    assert page.is_hidden("#a-groups-error")
    assert page.is_hidden("#a-method-error")
    watch.screenshot("lenet-feature-ablation-grid", element=page.locator("#pane-a"))


def test_next_to_run_the_pane_says_what_its_request_would_cost(watch: Watch) -> None:
    """The estimate is the API's dry run of the form's request: a smaller occlusion window is more forwards."""
    page = watch.page
    open_inspector(page, "model=lenet&method=occlusion")
    pick_sample(page, "digit_2")
    wait_pane(page, "a", "occlusion")
    assert re.fullmatch(r"took \d+\.\d\d? s", page.inner_text("#a-estimate")), page.inner_text("#a-estimate")

    def forwards() -> int:
        page.wait_for_function("() => /forwards/.test(document.querySelector('#a-estimate').textContent)")
        found = re.match(r"≈ ([\d,]+) forwards · ", page.inner_text("#a-estimate"))
        assert found, page.inner_text("#a-estimate")
        return int(found.group(1).replace(",", ""))

    page.fill("#a-window", "8,8")
    page.dispatch_event("#a-window", "change")
    coarse = forwards()
    page.fill("#a-window", "4,4")
    page.dispatch_event("#a-window", "change")
    page.wait_for_function(
        "n => !document.querySelector('#a-estimate').textContent.startsWith(`≈ ${n} `)", arg=f"{coarse:,}"
    )
    assert forwards() > coarse
    watch.screenshot("lenet-occlusion-estimate", element=page.locator("#pane-a"))


def test_cancel_stops_a_running_pane_and_keeps_its_last_picture(watch: Watch, cat_jpeg: Path) -> None:
    watch.allow(r"net::ERR_ABORTED|Failed to load resource")
    page = watch.page
    open_inspector(page, "model=resnet18&method=integrated_gradients")
    page.set_input_files("#file", str(cat_jpeg))
    wait_pane(page, "a", "integrated_gradients")
    before = heat_pixels(page, "a")
    page.fill("#a-steps", "512")
    page.click("#pane-a button.run")
    page.wait_for_selector('#pane-a[data-state="running"]')
    assert page.is_visible("#pane-a button.cancel")
    assert float(page.eval_on_selector("#pane-a figure.overlay", "f => getComputedStyle(f).opacity")) < 1
    page.wait_for_function("() => /running \\d/.test(document.querySelector('#a-estimate').textContent)")
    page.click("#pane-a button.cancel")
    page.wait_for_selector('#pane-a[data-state="cancelled"]')
    assert page.inner_text("#a-estimate").startswith("cancelled after")
    assert not page.is_visible("#pane-a button.cancel")
    assert heat_pixels(page, "a") == before  # the last finished picture stays
    watch.screenshot("resnet18-cancelled", element=page.locator("#pane-a"))


def test_a_model_without_class_scores_gets_the_panels_that_apply(watch: Watch, cat_jpeg: Path) -> None:
    """efficientvit_b0 (features only): no /predict, /saliency or /interventions is sent (each was a red 422);
    those panels say why, and the layers and the model card work as for any model."""
    page = watch.page
    open_inspector(page, "model=efficientvit_b0&layer=stages_0")
    page.set_input_files("#file", str(cat_jpeg))
    wait_layer(page)
    page.wait_for_selector("#state-box table tbody tr")
    for panel in ("#predict-panel", "#saliency-panel"):
        note = page.locator(f"{panel} > .no-classes")
        assert note.is_visible(), panel
        assert "gives no class scores" in note.inner_text()
    assert not page.is_visible("#pane-a")
    assert not page.is_visible("#topk-form")
    sent = [url for url in watch.requests if re.search(r"/(predict|saliency|interventions)(\?|$)", url)]
    assert sent == []
    watch.screenshot("efficientvit-no-class-scores")
    page.select_option("#model", "lenet")  # a model with class scores gets them back
    pick_sample(page, "digit_4")
    wait_prediction(page)
    wait_pane(page, "a", "gradient")
    assert not page.is_visible("#predict-panel > .no-classes")


def test_every_channel_of_a_wide_layer_can_be_switched_off(watch: Watch, server: LiveServer, cat_jpeg: Path) -> None:
    """resnet18's layer4 has 512 channels: all 512 have a box (only 0-255 had one), ranges untick many at once, and
    the edited top-k is the API's, with each class's change against the clean run."""
    page = watch.page
    open_inspector(page, "model=resnet18&layer=layer4")
    page.set_input_files("#file", str(cat_jpeg))
    wait_layer(page)
    assert "512 channels" in page.inner_text("#edit-site")
    assert page.locator("#edit-channels input").count() == 512
    page.fill("#edit-off", "600")
    page.click("#edit-off-apply")
    page.wait_for_selector("#edit-error:not([hidden])")
    assert "past the layer's last, 511" in page.inner_text("#edit-error")
    page.fill("#edit-off", "300-302, 511")
    page.click("#edit-off-apply")
    off = page.eval_on_selector_all("#edit-channels input", "boxes => boxes.filter(b => !b.checked).map(b => +b.value)")
    assert off == [300, 301, 302, 511]
    page.click("#edit-form button[type=submit]")
    page.wait_for_selector("#edit-edited:not([hidden])")
    assert "channels 300, 301, 302, 511 of layer4 zeroed" in page.inner_text("#edit-edited caption")
    shown = page.eval_on_selector_all("#edit-edited tbody tr", "rows => rows.map(r => +r.dataset.index)")
    files = {"image": ("chelsea.jpg", cat_jpeg.read_bytes(), "image/jpeg")}
    edit = '[{"site": "layer4", "op": "zero", "channels": [300, 301, 302, 511]}]'
    answer = httpx.post(
        f"{server.base_url}/interventions", data={"model": "resnet18", "edits": edit}, files=files, timeout=120
    )
    assert answer.status_code == 200, answer.text
    assert shown == [c["index"] for c in answer.json()["edited"][0]["top_k"]]
    assert page.locator("#edit-edited td.delta").count() == len(shown)
    watch.screenshot("resnet18-layer4-interventions", element=page.locator("#interventions-panel"))


@pytest.mark.parametrize("case", ["lenet/fc1/120", "resnet18/avgpool/512"])
def test_a_vector_shaped_layer_is_drawn_as_bars_on_one_scale(
    watch: Watch, server: LiveServer, cat_jpeg: Path, case: str
) -> None:
    """[N, K] and [N, C, 1, 1] outputs were one black 1-pixel tile per unit; now one bar per unit, shared scale,
    and a clicked bar says the API's value for that unit."""
    model, layer, count = case.split("/")
    units = int(count)
    page = watch.page
    open_inspector(page, f"model={model}&layer={layer}")
    page.set_input_files("#file", str(cat_jpeg))
    page.wait_for_selector("#vector-figure:not([hidden])")
    assert not page.is_visible("#grid-figure")
    assert page.get_attribute("#vector-canvas", "data-units") == str(units)
    assert f"{units} units on one shared scale" in page.inner_text("#vector-caption")
    assert image_stats(page, "#vector-canvas")["std"] > 10  # bars, not a blank box
    files = {"image": ("chelsea.jpg", cat_jpeg.read_bytes(), "image/jpeg")}
    body = {"model": model, "layers": layer}
    answer = httpx.post(f"{server.base_url}/activations", data=body, files=files, timeout=60).json()
    values = np.asarray(answer["activations"][layer]["output"]["data"], dtype=np.float64).ravel()
    box = page.locator("#vector-canvas").bounding_box()
    assert box is not None
    unit = int(np.argmax(values))
    page.mouse.click(box["x"] + (unit + 0.5) * box["width"] / units, box["y"] + box["height"] / 2)
    shown = page.inner_text("#vector-unit")
    found = re.fullmatch(r"unit (\d+): (\S+)", shown)
    assert found, shown
    clicked = int(found.group(1))
    assert abs(clicked - unit) <= 1, shown  # 512 bars share fewer pixels: a click may land on a neighbour
    assert math.isclose(float(found.group(2)), values[clicked], rel_tol=1e-3)
    watch.screenshot(f"{model}-{layer}-bars", element=page.locator("#layer-view"))


def test_a_sweep_ranks_the_channels_and_switches_one_off(watch: Watch, server: LiveServer) -> None:
    page = watch.page
    open_inspector(page, "model=lenet&sample=digit_7&layer=conv2")
    wait_layer(page)
    wait_prediction(page)
    page.click("#sweep-run")
    page.wait_for_selector("#sweep-table:not([hidden])")
    shown = page.eval_on_selector_all("#sweep-table tbody tr", "rows => rows.map(r => +r.dataset.channel)")
    sample = (Path(__file__).resolve().parents[2] / "service/zoo/samples/digit_7.png").read_bytes()
    files = {"image": ("digit_7.png", sample, "image/png")}
    answer = httpx.post(
        f"{server.base_url}/interventions/sweep", data={"model": "lenet", "site": "conv2"}, files=files, timeout=60
    ).json()
    assert shown == [c["channel"] for c in answer["channels"]]
    assert len(shown) == 16
    first = shown[0]
    assert f"the most needed: channel {first}" in page.inner_text("#sweep-status")
    page.click("#sweep-table tbody tr:first-child button.sweep-off")
    off = page.eval_on_selector_all("#edit-channels input", "boxes => boxes.filter(b => !b.checked).map(b => +b.value)")
    assert off == [first]
    watch.screenshot("lenet-conv2-sweep", element=page.locator("#interventions-panel"))


def test_a_module_called_several_times_has_a_call_picker(watch: Watch) -> None:
    """lenet's relu runs 4 times: the maps, the interventions' channels and the edit all refer to the picked call
    (the panel offered the last call's 84 channels while the maps showed the first's 6; unticking 50 was a 422)."""
    page = watch.page
    open_inspector(page, "model=lenet&sample=digit_4&layer=relu")
    wait_layer(page)
    wait_prediction(page)
    assert page.is_visible("#call-picker")
    assert page.locator("#layer-call option").count() == 4
    assert page.input_value("#layer-call") == "1"
    page.wait_for_function("() => document.querySelectorAll('#edit-channels input').length === 6")
    assert "[1, 6, 28, 28]" in page.inner_text("#layer-meta")
    page.select_option("#layer-call", "4")
    page.wait_for_selector("#vector-figure:not([hidden])")  # relu's 4th call gives [1, 84]
    page.wait_for_function("() => document.querySelectorAll('#edit-channels input').length === 84")
    assert "call 4" in page.inner_text("#edit-site")
    assert query(page)["call"] == "4"
    page.fill("#edit-off", "50")
    page.click("#edit-off-apply")
    page.click("#edit-form button[type=submit]")
    page.wait_for_selector("#edit-edited:not([hidden])")
    assert page.is_hidden("#edit-error")
    page.reload()  # the call is part of the link
    wait_layer(page)
    assert page.input_value("#layer-call") == "4"
    watch.screenshot("lenet-relu-call-4", element=page.locator("#layer-view"))


def test_the_model_card_shows_summary_state_dict_and_optimizer(watch: Watch, server: LiveServer) -> None:
    page = watch.page
    open_inspector(page, "model=lenet")
    page.wait_for_selector("#state-box table tbody tr")
    page.wait_for_selector("#optimizer-box .group")
    summary = httpx.get(f"{server.base_url}/models/lenet/summary?depth=1", timeout=30).json()
    state = httpx.get(f"{server.base_url}/models/lenet/state-dict", timeout=30).json()
    assert page.inner_text("#summary-box pre").strip() == summary["text"].strip()
    keys = page.eval_on_selector_all("#state-box tbody tr", "rows => rows.map(r => r.dataset.key)")
    assert keys == [e["key"] for e in state["entries"]]
    assert page.locator("#state-box tr.bad").count() == 0
    assert "no NaN or Inf" in page.inner_text("#state-box .verdict")
    assert "SGD · group 0" in page.inner_text("#optimizer-box")
    assert "momentum_buffer" in page.inner_text("#optimizer-box")
    shapes = page.eval_on_selector_all(
        "#tree-body .tree-row", "rows => rows.map(r => [r.dataset.layer, r.querySelector('.shape').textContent])"
    )
    assert ["conv1", "[1, 6, 28, 28]"] in shapes
    page.click("#card-repr summary")
    assert "LeNet(" in page.inner_text("#repr")
    watch.screenshot("lenet-model-card")


def equal_width_counts(values: np.ndarray[Any, Any], bins: int) -> list[int]:
    """numpy's counts of float32 `values` in `bins` equal-width bins from min to max, binned as the page bins them
    (in float64, the last bin closed)."""
    wide = values.astype(np.float64).ravel()
    lo, hi = wide.min(), wide.max()
    index = np.minimum(bins - 1, np.floor((wide - lo) / (hi - lo) * bins).astype(int))
    counts: list[int] = np.bincount(index, minlength=bins).tolist()
    return counts


def test_the_state_dict_sorts_filters_and_draws_a_histogram(watch: Watch, server: LiveServer) -> None:
    page = watch.page
    open_inspector(page, "model=lenet")
    page.wait_for_selector("#state-box table tbody tr")
    state = httpx.get(f"{server.base_url}/models/lenet/state-dict?stats=true", timeout=30).json()["entries"]
    page.click('#state-box th[data-sort="norm"] button')
    page.click('#state-box th[data-sort="norm"] button')  # twice: largest first
    keys = page.eval_on_selector_all("#state-box tbody tr", "rows => rows.map(r => r.dataset.key)")
    assert keys == [e["key"] for e in sorted(state, key=lambda e: -e["norm"])]
    assert page.get_attribute('#state-box th[data-sort="norm"]', "aria-sort") == "descending"
    page.fill("#state-filter", "conv*.weight")
    keys = page.eval_on_selector_all("#state-box tbody tr", "rows => rows.map(r => r.dataset.key)")
    assert sorted(keys) == ["conv1.weight", "conv2.weight"]
    assert page.inner_text("#state-count") == f"2 of {len(state)} tensors"
    page.click('#state-box tr[data-key="conv1.weight"] button.hist')
    page.wait_for_selector('#state-histogram[data-key="conv1.weight"]:not([hidden])')
    drawn = [int(c) for c in (page.get_attribute("#state-histogram-canvas", "data-counts") or "").split(",")]
    raw = httpx.get(f"{server.base_url}/models/lenet/state-dict?key=conv1.weight&format=npy", timeout=30).content
    assert drawn == equal_width_counts(np.load(io.BytesIO(raw)), len(drawn))
    assert "red line: zero" in page.inner_text("#state-histogram-caption")
    watch.screenshot("lenet-state-dict-histogram", element=page.locator("#card-panel"))


def test_a_layers_output_has_a_histogram_of_the_apis_values(watch: Watch, server: LiveServer) -> None:
    page = watch.page
    open_inspector(page, "model=lenet&sample=digit_6&layer=conv1")
    wait_layer(page)
    page.click("#act-histogram-button")
    page.wait_for_selector('#act-histogram[data-key="conv1"]:not([hidden])')
    drawn = [int(c) for c in (page.get_attribute("#act-histogram-canvas", "data-counts") or "").split(",")]
    sample = (Path(__file__).resolve().parents[2] / "service/zoo/samples/digit_6.png").read_bytes()
    files = {"image": ("digit_6.png", sample, "image/png")}
    answer = httpx.post(
        f"{server.base_url}/activations", data={"model": "lenet", "layers": "conv1"}, files=files, timeout=60
    )
    values = np.asarray(answer.json()["activations"]["conv1"]["output"]["data"], dtype=np.float32)
    assert drawn == equal_width_counts(values, len(drawn))
    assert sum(drawn) == 6 * 28 * 28
    assert "4,704 values" in page.inner_text("#act-histogram-caption")
    watch.screenshot("lenet-conv1-histogram", element=page.locator("#layer-view"))


def test_the_graph_view_draws_the_apis_nodes_with_their_skip_connections(watch: Watch, server: LiveServer) -> None:
    page = watch.page
    open_inspector(page, "model=resnet18")
    page.click("#graph-details > summary")
    page.wait_for_selector("#graph-box[data-nodes]")
    nodes = httpx.get(f"{server.base_url}/models/resnet18/nodes", timeout=60).json()["nodes"]
    shown = page.eval_on_selector_all("#graph-box .graph-row", "rows => rows.map(r => r.dataset.node)")
    assert shown == [n["name"] for n in nodes]
    names = {n["name"] for n in nodes}
    edges = sum(1 for n in nodes for i in n["inputs"] if i in names)
    assert page.locator("#graph-box path.edge").count() == edges
    adds = [n["name"] for n in nodes if sum(i in names for i in n["inputs"]) > 1]
    assert len(adds) == 8  # resnet18's residual adds, two per stage
    merges = page.eval_on_selector_all("#graph-box .graph-row.merge", "rows => rows.map(r => r.dataset.node)")
    assert merges == adds
    skips = page.eval_on_selector_all("#graph-box path.edge.skip", "ps => ps.map(p => p.dataset.to)")
    assert set(adds) <= set(skips)  # every add takes an arc from before the block it closes
    page.click('#graph-box .graph-row[data-node="layer1.0.conv1"] button')
    page.wait_for_selector('#tree-body .tree-row[data-layer="layer1.0.conv1"] .pick[aria-pressed="true"]')
    assert page.inner_text("#layer-title") == "layer1.0.conv1"
    assert "8 take several inputs" in page.inner_text("#graph-status")
    watch.screenshot("resnet18-graph", element=page.locator("#graph-details"))


def test_the_page_is_keyboard_reachable_and_labelled(watch: Watch) -> None:
    page = watch.page
    open_inspector(page, "model=lenet")
    for _ in range(60):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.classList.contains('sample')"):
            break
    else:
        pytest.fail("no sample digit reachable with Tab")
    page.keyboard.press("Enter")
    assert len(wait_prediction(page)) == 5
    unlabelled = page.evaluate(
        """() => [...document.querySelectorAll('input, select')]
            .filter(n => n.type !== 'hidden' && n.labels.length === 0 && !n.closest('[hidden]'))
            .map(n => n.id || n.name)"""
    )
    assert unlabelled == []
    assert page.evaluate("[...document.images].every(i => i.hasAttribute('alt'))")
    assert page.evaluate("[...document.querySelectorAll('canvas[role=img]')].every(c => c.getAttribute('aria-label'))")
