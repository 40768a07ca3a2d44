"""Request bodies: JSON or multipart on the same path, into a validated request model.

Multipart (curl-friendly): `model`, one or more `image` files, and every other field of the
JSON body as a form field (lists comma-separated, booleans true/false). An empty field of an optional
field is no field: its default applies, as when it is left out (Swagger UI's forms send every field).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, Union, get_args, get_origin

import orjson
from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile

from service.api.errors import clean_validation_errors
from service.config import Settings
from service.errors import BadInput, InvalidField, TooLarge

M = TypeVar("M", bound=BaseModel)
MULTIPART_PLACEHOLDER = "(multipart upload)"


@dataclass
class Parsed(Generic[M]):
    """The validated body, plus raw image bytes when they came as multipart files."""

    body: M
    images: list[bytes] | None


BodyClass = type[M] | Callable[[Mapping[str, Any]], type[M]]
"""A request model, or a function choosing one from the body's fields (a union discriminated by a field)."""


def is_multipart(content_type: str | bytes | None) -> bool:
    """Whether a body with this Content-Type is read as a multipart form; every other body is read as JSON,
    whatever its type says (`text/plain`, `application/octet-stream` or none, as curl and scripts send).

    The one test of the app's routes and of the cluster's router, so both read a body the same way.
    """
    if not content_type:
        return False
    text = content_type.decode("latin-1") if isinstance(content_type, bytes) else content_type
    return text.lstrip().lower().startswith("multipart/form-data")


async def parse_body(request: Request, model_cls: BodyClass[M], settings: Settings) -> Parsed[M]:
    """The validated body of a JSON or multipart request; multipart image files are kept as bytes."""
    if is_multipart(request.headers.get("content-type")):
        return await _parse_multipart(request, model_cls, settings)
    data = await read_json(request)
    body = validate(_chosen(model_cls, data), data)
    _check_count(body, settings)
    return Parsed(body, None)


def _chosen(model_cls: BodyClass[M], data: Any) -> type[M]:
    if isinstance(model_cls, type):
        return model_cls
    return model_cls(data if isinstance(data, Mapping) else {})


async def read_json(request: Request) -> Any:
    """The request body as JSON: 422 when empty, 400 when not JSON (invalid UTF-8 included)."""
    raw = await request.body()
    if not raw:
        raise InvalidField("empty body: send JSON (application/json) or a multipart form")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise BadInput("body is not valid JSON") from None


def validate(model_cls: type[M], data: Any) -> M:
    try:
        return model_cls.model_validate(data)
    except ValidationError as exc:
        raise InvalidField(clean_validation_errors(exc.errors(include_url=False))) from None


def _check_count(body: BaseModel, settings: Settings) -> None:
    inputs = getattr(body, "inputs", None)
    if inputs is not None and len(inputs) > settings.max_inputs:
        raise TooLarge(f"{len(inputs)} inputs, over the limit of {settings.max_inputs} per request (max_inputs)")


async def _parse_multipart(request: Request, chooser: BodyClass[M], settings: Settings) -> Parsed[M]:
    try:
        form = await request.form(max_files=settings.max_inputs + 1, max_fields=256, max_part_size=4 * 1024 * 1024)
    except Exception as exc:  # starlette raises several types for malformed forms
        message = str(getattr(exc, "detail", "")) or type(exc).__name__
        if message.startswith("Too many files"):
            raise TooLarge(f"more than {settings.max_inputs} images (max_inputs)") from None
        raise BadInput(f"malformed multipart form: {message}") from None
    try:
        given = {k: v for k, v in form.multi_items() if isinstance(v, str) and v.strip() != ""}
        model_cls = _chosen(chooser, given)
        data: dict[str, Any] = {}
        images: list[bytes] = []
        for key, value in form.multi_items():
            if isinstance(value, UploadFile):
                if key != "image":
                    raise InvalidField(f"unexpected file field {key!r}; files go in 'image'")
                if len(images) >= settings.max_inputs:
                    raise TooLarge(f"more than {settings.max_inputs} images (max_inputs)")
                images.append(await value.read())
            elif key in data:
                raise InvalidField(f"form field {key!r} given twice")
            elif value.strip() == "" and not _required(model_cls, key):
                continue  # an empty form field is no field: its default applies (Swagger UI sends every field)
            else:
                data[key] = _form_value(model_cls, key, value)
    finally:
        await form.close()
    if "inputs" in model_cls.model_fields:
        if not images:
            raise InvalidField("multipart requests need at least one 'image' file field")
        data["inputs"] = [{"image": MULTIPART_PLACEHOLDER} for _ in images]
    if "target" in data:
        data["target"] = _form_target(data["target"])
    body = validate(model_cls, data)
    return Parsed(body, images or None)


def _required(model_cls: type[BaseModel], key: str) -> bool:
    field = model_cls.model_fields.get(key)
    return field is not None and field.is_required()


def _form_target(target: Any) -> Any:
    """Multipart `target=7` arrives as `[7]` (form lists are comma-separated): one class for every image."""
    if not isinstance(target, list):
        return target
    if not target or (len(target) == 1 and target[0] in ("null", "none")):
        return None
    return target[0] if len(target) == 1 else target


def _form_value(model_cls: type[BaseModel], key: str, value: str) -> Any:
    """Lists are comma-separated; JSON-looking values are parsed; the rest pydantic coerces."""
    field = model_cls.model_fields.get(key)
    if field is None:
        return value
    if _accepts_list(field.annotation) and not value.startswith("["):
        return [_scalar(v.strip()) for v in value.split(",") if v.strip()]
    if value.startswith(("[", "{")):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    if value in ("null", "none", "") and _accepts_none(field.annotation):
        return None
    return value


def _scalar(text: str) -> Any:
    return int(text) if text.lstrip("-").isdigit() else text


def annotation_members(annotation: Any) -> tuple[Any, ...]:
    """The types a field's annotation admits: a union's members (nested ones flattened), Annotated unwrapped."""
    origin = get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        return tuple(m for arg in get_args(annotation) for m in annotation_members(arg))
    if origin is typing.Annotated:
        return annotation_members(get_args(annotation)[0])
    return (annotation,)


def is_list_type(member: Any) -> bool:
    return get_origin(member) is list or member is list


def _accepts_list(annotation: Any) -> bool:
    return any(is_list_type(m) for m in annotation_members(annotation))


def _accepts_none(annotation: Any) -> bool:
    return any(m is type(None) for m in annotation_members(annotation))
