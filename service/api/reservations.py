"""Memory reserved for a request is given back when its answer has been sent, not when its work returns.

A pure ASGI middleware opens `held_until_answered` around each HTTP request; reservations the
data plane makes inside it (`service.runtime.admission`) are released after the last byte of
the answer (or when the request fails), so the answer's encoding and sending count too.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from service.runtime.admission import held_until_answered


class ReleaseWhenAnsweredMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with held_until_answered() as releases:
            try:
                await self.app(scope, receive, send)
            finally:
                for release in releases:
                    release()
