"""The admin token, whatever front it arrives on: `Bearer <HOOKSERVE_ADMIN_TOKEN>`, compared in constant time.

REST reads it from the `Authorization` header, gRPC from the `authorization` call metadata, the
TorchServe management API from its `Authorization` header: all of them ask this one check.
"""

from __future__ import annotations

import hmac

from service.errors import Forbidden, Unauthorized


def check_admin(authorization: str | None, token: str | None) -> None:
    """403 when admin calls are disabled (no token configured), 401 when the credentials are missing or wrong."""
    if not token:
        raise Forbidden("admin calls are disabled: no HOOKSERVE_ADMIN_TOKEN is configured")
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise Unauthorized("admin call needs 'Authorization: Bearer <token>'", headers={"WWW-Authenticate": "Bearer"})
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise Unauthorized("wrong admin token", headers={"WWW-Authenticate": "Bearer"})
