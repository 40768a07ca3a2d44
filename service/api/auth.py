"""Admin token: `Authorization: Bearer <HOOKSERVE_ADMIN_TOKEN>`, compared in constant time."""

from __future__ import annotations

import hmac

from fastapi import Request

from service.api.deps import StateDep
from service.errors import Forbidden, Unauthorized


def check_admin(authorization: str | None, token: str | None) -> None:
    if not token:
        raise Forbidden("admin calls are disabled: no HOOKSERVE_ADMIN_TOKEN is configured")
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise Unauthorized("admin call needs 'Authorization: Bearer <token>'", headers={"WWW-Authenticate": "Bearer"})
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise Unauthorized("wrong admin token", headers={"WWW-Authenticate": "Bearer"})


async def require_admin(request: Request, state: StateDep) -> None:
    check_admin(request.headers.get("authorization"), state.settings.admin_token)
