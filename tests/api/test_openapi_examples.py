"""What /docs pre-fills runs: every operation that takes images answers 200 to its JSON example and to its form's
defaults (what Swagger UI's Try it out sends unchanged), and each documented error has its own example."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

SAMPLE = Path(__file__).resolve().parents[2] / "service" / "zoo" / "samples" / "digit_4.png"


def image_operations(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """path -> POST operation, for each whose multipart form takes image files."""
    found = {}
    for path, item in document["paths"].items():
        form = item.get("post", {}).get("requestBody", {}).get("content", {}).get("multipart/form-data", {})
        if "image" in form.get("schema", {}).get("properties", {}):
            found[path] = item["post"]
    return found


def json_example(document: dict[str, Any], operation: dict[str, Any]) -> Any:
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    name = schema["$ref"].rsplit("/", 1)[-1]
    return document["components"]["schemas"][name]["examples"][0]


def form_prefill(operation: dict[str, Any]) -> dict[str, str]:
    """The form fields as Swagger UI fills them and sends them: example, else default, empty ones included."""
    props = operation["requestBody"]["content"]["multipart/form-data"]["schema"]["properties"]
    sent = {}
    for name, prop in props.items():
        if name == "image":
            continue
        value = prop.get("example", prop.get("default"))
        assert value is not None, f"{name} pre-fills as its type's sample ({prop['type']})"
        sent[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return sent


@pytest.fixture(scope="module")
def document(builtin_client: TestClient) -> dict[str, Any]:
    found: dict[str, Any] = builtin_client.get("/openapi.json").json()
    return found


def test_the_image_operations_are_found(document: dict[str, Any]) -> None:
    assert set(image_operations(document)) >= {"/predict", "/saliency", "/activations", "/interventions", "/attention"}


def test_every_json_example_runs(builtin_client: TestClient, document: dict[str, Any]) -> None:
    answers = {
        path: builtin_client.post(path, json=json_example(document, operation))
        for path, operation in image_operations(document).items()
    }
    assert {p: a.status_code for p, a in answers.items()} == dict.fromkeys(answers, 200), {
        p: a.text[:300] for p, a in answers.items() if a.status_code != 200
    }


def test_every_form_runs_as_pre_filled(builtin_client: TestClient, document: dict[str, Any]) -> None:
    answers = {}
    for path, operation in image_operations(document).items():
        fields = form_prefill(operation)
        files = {"image": ("digit.png", SAMPLE.read_bytes(), "image/png")}
        answers[path] = builtin_client.post(path, data=fields, files=files)
    assert {p: a.status_code for p, a in answers.items()} == dict.fromkeys(answers, 200), {
        p: a.text[:300] for p, a in answers.items() if a.status_code != 200
    }


def test_form_fields_are_typed_with_the_body_defaults(document: dict[str, Any]) -> None:
    props = image_operations(document)["/predict"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    top_k = props["properties"]["top_k"]
    assert (top_k["type"], top_k["default"], top_k["example"]) == ("integer", 5, 3)  # the JSON example's 3
    assert props["properties"]["include_logits"]["type"] == "boolean"
    assert props["properties"]["model"]["example"] == "lenet"
    saliency = image_operations(document)["/saliency"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    method = saliency["properties"]["method"]
    assert method["default"] == "gradcam"
    assert "occlusion" in method["enum"]
    assert saliency["properties"]["window"]["example"] == ""  # occlusion's alone: sent with gradcam, a 422


def test_each_error_status_has_its_own_example(document: dict[str, Any]) -> None:
    responses = document["paths"]["/predict"]["post"]["responses"]
    details = {
        code: r["content"]["application/json"]["example"]["detail"] for code, r in responses.items() if code >= "4"
    }
    assert len(set(details.values())) == len(details) >= 5, details
    assert "no model named" in details["404"]
    assert "no model named" not in details["422"]
