"""Admin token: `Authorization: Bearer <HOOKSERVE_ADMIN_TOKEN>` (the check itself: `service.dataplane.admin`)."""

from __future__ import annotations

from fastapi import Request

from service.api.deps import StateDep
from service.dataplane.admin import check_admin

__all__ = ["check_admin", "require_admin"]


async def require_admin(request: Request, state: StateDep) -> None:
    check_admin(request.headers.get("authorization"), state.settings.admin_token)
