"""Headers every answer carries, whichever layer wrote it (a route, an error handler, a limit, a shutdown cut)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Browsers must take each answer as the type it says (a JSON error is never sniffed into HTML or script).
EVERY_ANSWER = ((b"x-content-type-options", b"nosniff"),)


class EveryAnswerHeadersMiddleware:
    """Adds `EVERY_ANSWER` to each HTTP answer's headers (pure ASGI, outermost, so 413s and 503s get them too)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(name, value) for name, value in EVERY_ANSWER if name not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)
