"""OpenAPI helpers: request bodies that accept JSON or multipart, and documented errors."""

from __future__ import annotations

import enum
import json
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field, TypeAdapter
from pydantic.fields import FieldInfo

from service.api.bodies import annotation_members, is_list_type
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


_ERROR_EXAMPLE = {  # one answer of each kind, as the server words it
    400: "inputs[0].image is not a decodable image (PNG, JPEG, WebP, BMP, ...)",
    401: "admin call needs 'Authorization: Bearer <token>'",
    403: "absolute paths are refused; give a path relative to the model dir",
    404: "no model named 'resnet-18'; did you mean 'resnet18'? GET /models lists them",
    409: "model 'resnet18' is loading",
    413: "17 inputs, over the limit of 16 per request (max_inputs)",
    422: "unknown layer 'layer5'; closest: 'layer4', 'layer3', 'layer2', 'layer1', 'layer4.1' "
    "(GET /models/{name}/layers lists them)",
    503: "queue full (64 jobs, max_queue); retry shortly",
    504: "the request's deadline had passed before it reached the model",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {
        code: {
            "model": ErrorBody,
            "description": _ERROR_TEXT[code],
            "content": {"application/json": {"example": {"detail": _ERROR_EXAMPLE[code]}}},
        }
        for code in codes
    }


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
    return _json_or_multipart(model_cls.__name__, [model_cls], example=_example_of(model_cls))


def _example_of(model_cls: type[BaseModel]) -> dict[str, Any]:
    """The body's first JSON example (its `json_schema_extra`), or none."""
    extra = model_cls.model_config.get("json_schema_extra")
    examples = extra.get("examples") if isinstance(extra, dict) else None
    first = examples[0] if isinstance(examples, list) and examples else None
    return first if isinstance(first, dict) else {}


def union_body_with_multipart(
    name: str, variants: list[type[BaseModel]], method_description: str, example: dict[str, Any]
) -> dict[str, Any]:
    """`openapi_extra` for a body that is one of `variants`, discriminated by their `method` field."""
    _UNIONS[name] = variants
    _UNION_EXAMPLES[name] = example
    return _json_or_multipart(name, variants, {"method": method_description}, example=example)


def _json_or_multipart(
    name: str,
    variants: list[type[BaseModel]],
    descriptions: dict[str, str] | None = None,
    *,
    example: dict[str, Any],
) -> dict[str, Any]:
    """The JSON body by reference, and a multipart form with every field of every variant, typed as the JSON body
    types it and pre-filled with the JSON example's value, else its default (Swagger UI's Try it out sends what it
    pre-fills, so the form runs as the JSON example does)."""
    props: dict[str, Any] = {
        "image": {"type": "array", "items": {"type": "string", "format": "binary"}, "description": "Image files."}
    }
    owners: dict[str, list[FieldInfo]] = {}
    for model_cls in variants:
        for field_name, field in model_cls.model_fields.items():
            if field_name != "inputs":
                owners.setdefault(field_name, []).append(field)
    for field_name, fields in owners.items():
        # a field only some methods take is left empty: sent with another method, it would be refused
        props[field_name] = form_property(fields, prefill=len(fields) == len(variants))
    for field_name, value in example.items():
        if field_name in props and field_name != "image" and field_name not in (descriptions or {}):
            props[field_name] = _with_example(props[field_name], value)
    for field_name, description in (descriptions or {}).items():  # the discriminator: one value per variant
        choices = [_literal_value(v.model_fields[field_name]) for v in variants]
        props[field_name] = {
            "type": "string",
            "description": description,
            "enum": choices,
            "default": example.get(field_name, choices[0]),
        }
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


def _with_example(prop: dict[str, Any], value: Any) -> dict[str, Any]:
    """`prop` pre-filled with `value` as a form field carries it: a list of scalars comma-separated, an object or a
    list of objects as JSON."""
    if prop["type"] == "string" and not isinstance(value, str):
        scalars = isinstance(value, list) and all(isinstance(v, str | int | float) for v in value)
        value = ",".join(map(str, value)) if scalars else json.dumps(value)
    return prop | {"example": value}


_FORM_TYPES: dict[Any, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}


def form_property(fields: list[FieldInfo], *, prefill: bool = True) -> dict[str, Any]:
    """One form field for the same-named field of one or more body models: its type where it is one scalar (else a
    string: lists comma-separated, objects as JSON) and its default where they all agree; where there is none to
    pre-fill, an empty string (Swagger UI sends it, and an empty optional form field is no field: the body's own
    default applies)."""
    first = fields[0]
    prop: dict[str, Any] = {"type": "string", "description": first.description or "As in the JSON body."}
    members = [m for m in annotation_members(first.annotation) if m is not type(None)]
    if len(members) == 1 and members[0] in _FORM_TYPES:
        prop["type"] = _FORM_TYPES[members[0]]
    elif len(members) == 1 and get_origin(members[0]) is Literal:
        prop["enum"] = [v.value if isinstance(v, enum.Enum) else v for v in get_args(members[0])]
    elif len(members) == 1 and isinstance(members[0], type) and issubclass(members[0], enum.Enum):
        prop["enum"] = [m.value for m in members[0]]
    elif any(is_list_type(m) for m in members):
        prop["description"] += " Comma-separated."
    defaults = {_form_default(f) for f in fields}
    if prefill and first.is_required() and first.examples:
        example = first.examples[0]
        prop["example"] = ",".join(map(str, example)) if isinstance(example, list | tuple) else example
    elif prefill and len(defaults) == 1 and (default := defaults.pop()) is not None:
        prop["default"] = default
    else:  # pre-filled empty, so typed as a string (an empty number is none); sent empty, it counts as no field
        if prop["type"] != "string":
            prop["description"] += f" ({'an' if prop['type'] == 'integer' else 'a'} {prop['type']})"
            prop["type"] = "string"
        prop["example"] = ""
        if len(defaults) > 1:
            prop["description"] += " Its default depends on the method."
    return prop


def _form_default(field: FieldInfo) -> Any:
    """The field's default as a form sends it: None where it has none (or it is None)."""
    if field.is_required() or field.default is None:
        return None
    value = field.default
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list | tuple):
        return ",".join(str(v.value if isinstance(v, enum.Enum) else v) for v in value) or None
    return value if isinstance(value, bool | int | float | str) else None


def _literal_value(field: FieldInfo) -> Any:
    values = get_args(field.annotation) if get_origin(field.annotation) is Literal else (field.default,)
    value = values[0]
    return value.value if isinstance(value, enum.Enum) else value


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
