"""The /saliency request: every registered method's parameters beside the shared fields, discriminated by `method`."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any, cast

from pydantic import BaseModel, create_model

from service.errors import InvalidField
from service.introspection.attribution.base import AttributionMethod, method_named, registered_methods
from service.schemas.attribution import SaliencyCommon

DEFAULT_METHOD = "gradient"  # what a request without `method` means


@cache
def request_class(name: str) -> type[SaliencyCommon]:
    """The request body of method `name`: the shared fields and the method's own."""
    method: AttributionMethod[Any] = method_named(name)
    bases: tuple[type[BaseModel], ...] = (method.params, SaliencyCommon)  # the shared fields first
    cls = create_model(
        f"{type(method).__name__}SaliencyRequest",
        __base__=bases,
        __doc__=f"/saliency with method {name}: {method.title}.",
    )
    return cast(type[SaliencyCommon], cls)


def choose_request(data: Mapping[str, Any]) -> type[SaliencyCommon]:
    """The request class a body's `method` names (gradient when it names none)."""
    name = data.get("method", DEFAULT_METHOD)
    if not isinstance(name, str) or name not in registered_methods():
        choices = ", ".join(registered_methods())
        known = {field for m in registered_methods() for field in request_class(m).model_fields}
        problems = [{"loc": ["method"], "msg": f"Input should be one of {choices}", "type": "enum"}]
        problems += [
            {"loc": [key], "msg": "Extra inputs are not permitted", "type": "extra_forbidden"}
            for key in data
            if key not in known
        ]
        raise InvalidField(problems)
    chosen = request_class(name)
    misplaced = []
    for key in data:
        owners = [m for m in registered_methods() if key in request_class(m).model_fields]
        if key not in chosen.model_fields and owners:
            msg = f"{key!r} is a parameter of {_listing(owners)}, not of {name}"
            misplaced.append({"loc": [key], "msg": msg, "type": "extra_forbidden"})
    if misplaced:
        raise InvalidField(misplaced)
    return chosen


def _listing(names: list[str]) -> str:
    """`a`, `a and b`, `a, b and c`."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
