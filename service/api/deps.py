"""What routes depend on: the app's state, the data plane, and a ready model named in the path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path, Request

from service.api.uploads import UploadSlots
from service.config import Settings
from service.dataplane.plane import DataPlane
from service.jobs.manager import JobManager
from service.runtime.fleet import Fleet, ServedModel


@dataclass
class AppState:
    """Lives on `app.state.hookserve` while the lifespan runs."""

    settings: Settings
    fleet: Fleet
    plane: DataPlane
    uploads: UploadSlots
    jobs: JobManager
    draining: bool = False


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.hookserve
    return state


StateDep = Annotated[AppState, Depends(app_state)]


def data_plane(request: Request) -> DataPlane:
    return app_state(request).plane


PlaneDep = Annotated[DataPlane, Depends(data_plane)]


def job_manager(request: Request) -> JobManager:
    return app_state(request).jobs


JobsDep = Annotated[JobManager, Depends(job_manager)]

ModelName = Annotated[str, Path(description="A model name from GET /models.", examples=["lenet"])]


def ready_model(name: ModelName, plane: PlaneDep) -> ServedModel:
    """The model the path names, if it is ready (404 unknown, 409 loading or failed)."""
    return plane.ready(name)


ReadyModel = Annotated[ServedModel, Depends(ready_model)]
