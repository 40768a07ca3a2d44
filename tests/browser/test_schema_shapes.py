"""The page reads what the server offers from /openapi.json: a saliency method the server does not have
is served here as a stand-in schema, and /interventions is hidden from one, so the page is shown to offer
whatever the schema offers; every request still goes to the live server."""

from __future__ import annotations

import copy
import json
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.browser.conftest import Watch
from tests.browser.inspector_page import (
    choose_method,
    open_inspector,
    pick_sample,
    select_layer,
    top_k,
    wait_pane,
    wait_prediction,
)
from tests.reliability.live_server import LiveServer

if TYPE_CHECKING:
    pass

NEW_METHOD = "lime"  # a method the server does not have: it must still appear, with its own fields
NEW_FIELDS = {
    "patch": {
        "type": "array",
        "items": {"type": "integer"},
        "default": [3, 8, 8],
        "description": "lime: patch.",
    },
    "patch_strides": {
        "type": "array",
        "items": {"type": "integer"},
        "default": [3, 4, 4],
        "description": "lime: patch strides",
    },
}


@pytest.fixture(scope="module")
def schema(server: LiveServer) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(f"{server.base_url}/openapi.json", timeout=30).json()
    return answer


def union_methods(schema: dict[str, Any]) -> list[str]:
    """The saliency methods of the served union, in its `oneOf` order."""
    components = schema["components"]["schemas"]
    refs = [variant["$ref"].rsplit("/", 1)[-1] for variant in components["SaliencyRequest"]["oneOf"]]
    return [components[ref]["properties"]["method"]["const"] for ref in refs]


def with_new_method(schema: dict[str, Any]) -> dict[str, Any]:
    """The served union with one more variant: a method whose fields no other method has."""
    out = copy.deepcopy(schema)
    components = out["components"]["schemas"]
    gradient = components[components["SaliencyRequest"]["discriminator"]["mapping"]["gradient"].rsplit("/", 1)[-1]]
    props = copy.deepcopy(gradient["properties"])
    props["method"] = {"const": NEW_METHOD, "default": NEW_METHOD, "type": "string", "title": "Method"}
    props |= NEW_FIELDS
    components["LimeSaliencyRequest"] = {**gradient, "properties": props}
    ref = "#/components/schemas/LimeSaliencyRequest"
    components["SaliencyRequest"]["oneOf"].append({"$ref": ref})
    components["SaliencyRequest"]["discriminator"]["mapping"][NEW_METHOD] = ref
    return out


def test_a_saliency_union_gives_each_method_its_own_fields(watch: Watch, schema: dict[str, Any]) -> None:
    watch.allow(r"Failed to load resource: the server responded with a status of 422")
    page = watch.page
    page.route("**/openapi.json", lambda route: route.fulfill(json=with_new_method(schema)))
    open_inspector(page, "model=lenet")
    offered = page.eval_on_selector_all("#a-method option", "options => options.map(o => o.value)")
    assert offered == [*union_methods(schema), NEW_METHOD]
    pick_sample(page, "digit_8")
    wait_pane(page, "a", "gradient")
    wait_pane(page, "b", "gradcam")
    assert page.locator("#b-layer").count() == 1
    assert page.locator("#a-layer").count() == 0
    choose_method(page, "a", "smoothgrad")
    wait_pane(page, "a", "smoothgrad")
    fields = page.eval_on_selector_all("#pane-a .params input", "inputs => inputs.map(i => i.name)")
    assert fields == ["samples", "noise", "seed"]
    choose_method(page, "a", NEW_METHOD)
    assert page.locator("#a-patch").input_value() == "3,8,8"
    page.wait_for_selector("#a-method-error:not([hidden])")
    assert page.inner_text("#a-method-error").startswith("422: method: ")
    page.wait_for_selector("#a-patch-error:not([hidden])")
    assert page.inner_text("#a-patch-error").startswith("422: patch: ")
    watch.screenshot("saliency-union-schema")


def test_the_interventions_panel_stays_hidden_without_the_endpoint(watch: Watch, schema: dict[str, Any]) -> None:
    without = copy.deepcopy(schema)
    without["paths"].pop("/interventions")
    page = watch.page
    page.route("**/openapi.json", lambda route: route.fulfill(json=without))
    open_inspector(page, "model=lenet")
    assert page.is_hidden("#interventions-panel")


def test_the_interventions_panel_zeroes_the_unticked_channels(watch: Watch, server: LiveServer) -> None:
    """Against the server's own /interventions: zeroing channel 15 of conv2 turns the 7 into an 8."""
    page = watch.page
    sent: list[dict[str, Any]] = []
    page.on(
        "request", lambda r: sent.append(json.loads(r.post_data or "{}")) if r.url.endswith("/interventions") else None
    )
    open_inspector(page, "model=lenet")
    assert page.is_visible("#interventions-panel")
    pick_sample(page, "digit_7")
    clean = wait_prediction(page)
    assert clean[0].index == 7
    select_layer(page, "conv2")
    assert page.locator("#edit-channels input").count() == 16
    page.uncheck("#edit-channels input[value='15']")
    page.click("#edit-form button[type=submit]")
    page.wait_for_selector('#interventions-panel[data-state="done"]')
    assert sent[0]["edits"] == [{"site": "conv2", "op": "zero", "channels": [15]}]
    assert [r.index for r in top_k(page, "#edit-clean")] == [r.index for r in clean]
    assert top_k(page, "#edit-edited")[0].index == 8
    watch.screenshot("interventions")
