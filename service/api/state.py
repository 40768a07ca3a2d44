"""What the routers share: settings, registry, thread pools. Lives on `app.state.hookserve`."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from service.config import Settings
from service.runtime.fleet import Fleet


@dataclass
class AppState:
    settings: Settings
    fleet: Fleet
    decode_pool: ThreadPoolExecutor
    draining: bool = False


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.hookserve
    return state


StateDep = Annotated[AppState, Depends(app_state)]
