"""Request body limits, enforced while the body streams in (pure ASGI middleware)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.asgi_errors import Envelopes, error_body, send_error
from service.api.bodies import is_multipart


class _BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """413 once a body passes its limit: `upload_limit` for multipart uploads to upload paths, `limit` elsewhere."""

    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        upload_limit: int,
        upload_paths: tuple[str, ...],
        envelopes: Envelopes | None = None,
    ) -> None:
        """`envelopes`: path prefix -> the error body for paths under it (default `{"detail": ...}`)."""
        self.app = app
        self.envelopes = dict(envelopes or {})
        self.limit = limit
        self.upload_limit = upload_limit
        self.upload_paths = upload_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        headers = dict(scope.get("headers", []))
        # Only a multipart file upload streams to disk; any other body is read into memory.
        is_upload = path.startswith(self.upload_paths) and is_multipart(headers.get(b"content-type"))
        limit, name = (self.upload_limit, "max_upload_bytes") if is_upload else (self.limit, "max_body_bytes")
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > limit:
            await self._send_413(send, path, limit, name)
            return
        received = 0
        started = over = replaced = False

        async def limited_receive() -> Message:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True
                    raise _BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            """Once the body overflowed, the app's own answer (it may have caught the error) becomes the 413."""
            nonlocal started, replaced
            if message["type"] == "http.response.start":
                started = True
                if over:
                    replaced = True
                    await self._send_413(send, path, limit, name)
            if not replaced:
                await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await self._send_413(send, path, limit, name)

    async def _send_413(self, send: Send, path: str, limit: int, name: str) -> None:
        detail = f"request body over the {limit}-byte limit ({name})"
        await send_error(send, 413, error_body(self.envelopes, path, detail, 413))
