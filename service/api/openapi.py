"""OpenAPI helpers: request bodies that accept JSON or multipart, and documented errors."""

from __future__ import annotations

from typing import Annotated, Any, Union

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field, TypeAdapter

from service.codecs.formats import OCTET
from service.schemas.common import ErrorBody

REF_TEMPLATE = "#/components/schemas/{model}"

_BODY_MODELS: list[type[BaseModel]] = []
_UNIONS: dict[str, list[type[BaseModel]]] = {}  # bodies that are a union discriminated by `method`
_UNION_EXAMPLES: dict[str, dict[str, Any]] = {}

BINARY_OR_PNG: dict[int | str, dict[str, Any]] = {
    200: {"content": {OCTET: {}, "image/png": {}}, "description": "JSON, a binary file, or a PNG."}
}

_ERROR_TEXT = {
    400: "Undecodable input (bad base64, not an image, not JSON).",
    401: "Missing or wrong admin token.",
    403: "Admin calls disabled, or a path outside the model dir.",
    404: "Unknown model or tensor.",
    409: "Model not ready (loading or failed).",
    413: "Body, image or response over its limit; the detail says which and what to ask for instead.",
    422: "Invalid field (unknown layer, bad target, wrong tensor shape...).",
    503: "Queue full or device out of memory; see Retry-After.",
    504: "The request's deadline passed.",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorBody, "description": _ERROR_TEXT[code]} for code in codes}


def register_schema(model_cls: type[BaseModel]) -> None:
    """Put a model that no route parameter names into the schema's components."""
    _BODY_MODELS.append(model_cls)


def json_body(model_cls: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a path that reads its JSON body itself (after its dependencies ran)."""
    _BODY_MODELS.append(model_cls)
    ref = {"$ref": f"#/components/schemas/{model_cls.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def body_with_multipart(model_cls: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a path that reads its body itself (JSON or multipart form)."""
    _BODY_MODELS.append(model_cls)
    return _json_or_multipart(model_cls.__name__, [model_cls])


def union_body_with_multipart(
    name: str, variants: list[type[BaseModel]], method_description: str, example: dict[str, Any]
) -> dict[str, Any]:
    """`openapi_extra` for a body that is one of `variants`, discriminated by their `method` field."""
    _UNIONS[name] = variants
    _UNION_EXAMPLES[name] = example
    return _json_or_multipart(name, variants, {"method": method_description})


def _json_or_multipart(
    name: str, variants: list[type[BaseModel]], descriptions: dict[str, str] | None = None
) -> dict[str, Any]:
    """The JSON body by reference, and a multipart form with every field of every variant as a string."""
    props: dict[str, Any] = {
        "image": {"type": "array", "items": {"type": "string", "format": "binary"}, "description": "Image files."}
    }
    for model_cls in variants:
        for field_name, field in model_cls.model_fields.items():
            if field_name == "inputs" or field_name in props:
                continue  # the first variant that has a field describes it
            props[field_name] = {
                "type": "string",
                "description": field.description or "As in the JSON body; lists comma-separated.",
            }
    for field_name, description in (descriptions or {}).items():
        props[field_name] = {"type": "string", "description": description}
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}},
                "multipart/form-data": {
                    "schema": {"type": "object", "properties": props, "required": ["model", "image"]}
                },
            },
        }
    }


def install_openapi(app: FastAPI) -> None:
    """Add the manually-read body models (and their sub-models) to the schema's components."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes, tags=app.openapi_tags
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for cls in _BODY_MODELS:
            body = cls.model_json_schema(ref_template=REF_TEMPLATE)
            for name, sub in body.pop("$defs", {}).items():
                components.setdefault(name, sub)
            components[cls.__name__] = body
        for name, variants in _UNIONS.items():
            union = Annotated[Union[tuple(variants)], Field(discriminator="method")]  # type: ignore[valid-type]  # noqa: UP007
            body = TypeAdapter(union).json_schema(ref_template=REF_TEMPLATE)  # type: ignore[arg-type]
            for sub_name, sub in body.pop("$defs", {}).items():
                components.setdefault(sub_name, sub)
            components[name] = body | {"examples": [_UNION_EXAMPLES[name]]}
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
