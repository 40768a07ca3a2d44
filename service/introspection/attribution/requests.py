"""The /saliency request: every registered method's parameters beside the shared fields, discriminated by `method`."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
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
        msg = f"Input should be one of {choices}" + _did_you_mean(name, registered_methods())
        problems = [{"loc": ["method"], "msg": msg, "type": "enum"}]
        problems += [
            {
                "loc": [key],
                "msg": f"Extra inputs are not permitted{_did_you_mean(key, known)}",
                "type": "extra_forbidden",
            }
            for key in data
            if key not in known
        ]
        raise InvalidField(problems)
    chosen = request_class(name)
    misplaced = []
    for key in data:
        if key in chosen.model_fields:
            continue
        owners = [m for m in registered_methods() if key in request_class(m).model_fields]
        if owners:
            msg = f"{key!r} is a parameter of {_listing(owners)}, not of {name}"
            misplaced.append({"loc": [key], "msg": msg, "type": "extra_forbidden"})
        elif hint := _did_you_mean(key, chosen.model_fields):
            misplaced.append({"loc": [key], "msg": f"Extra inputs are not permitted{hint}", "type": "extra_forbidden"})
    if misplaced:
        raise InvalidField(misplaced)
    return chosen


def _did_you_mean(value: object, choices: Iterable[str]) -> str:
    """`; did you mean 'strides'?` when a known name is close to `value`, else nothing."""
    found = difflib.get_close_matches(str(value), list(choices), n=1, cutoff=0.6)
    return f"; did you mean {found[0]!r}?" if found else ""


def _listing(names: list[str]) -> str:
    """`a`, `a and b`, `a, b and c`."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
