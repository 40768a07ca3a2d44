"""The application factory: `create_app(settings)`; the lifespan owns the fleet, the data plane and the pools."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from service import __version__
from service.api.deps import AppState
from service.api.disconnect import CancelOnDisconnectMiddleware
from service.api.errors import install_error_handlers
from service.api.headers import EveryAnswerHeadersMiddleware
from service.api.limits import BodyLimitMiddleware
from service.api.metrics import job_observer, removal_observer
from service.api.observability import install_observability
from service.api.openapi import install_openapi
from service.api.reservations import ReleaseWhenAnsweredMiddleware
from service.api.routes import (
    activations,
    attention,
    checkpoints,
    docs,
    gradients,
    health,
    interventions,
    introspect,
    jobs,
    metrics,
    models,
    nodes,
    predict,
    saliency,
    ui,
    v2,
)
from service.api.shutdown import AnswerWhenCutMiddleware, ShutdownNotice
from service.api.uploads import UploadSlots
from service.config import Settings
from service.dataplane.plane import DataPlane
from service.fronts import side_fronts
from service.jobs.manager import JobManager
from service.registry.builtin import ZOO_DIR, builtin_specs
from service.runtime.fleet import Fleet
from service.runtime.threads import start_decode_thread
from service.specs.model import load_specs
from service.torchserve import inference as torchserve

log = logging.getLogger("hookserve")

DESCRIPTION = """\
Inference **and** introspection for PyTorch models over HTTP: predictions with dynamic
batching, per-layer activations from request-scoped hooks, gradients and saliency maps
(Captum), torchinfo summaries, state-dict, optimizer and checkpoint metadata.

[The inspector](/ui) shows all of it on one page; [ReDoc](/redoc) renders this schema too.
"""

UPLOAD_PATHS = ("/checkpoints/inspect",)
MODEL_RUNNING_PATHS = (
    "/predict",
    "/activations",
    "/attention",
    "/gradients",
    "/saliency",
    "/interventions",
    "/interventions/sweep",
)


def runs_a_model(path: str) -> bool:
    """The POST (and PUT) paths whose work a client's leaving should cancel."""
    if path.startswith(torchserve.PATHS):
        return True
    return path in MODEL_RUNNING_PATHS or (path.startswith(f"{v2.PREFIX}/models/") and path.endswith("/infer"))


# Errors answered outside a route (body limit, shutdown) in the envelope of the protocol that owns the path
ENVELOPES = {v2.PREFIX: v2.oip_error_body} | dict.fromkeys(torchserve.PATHS, torchserve.error_bytes)

ROUTERS = (
    health.router,
    models.router,
    predict.router,
    activations.router,
    attention.router,  # /attention: a vision transformer's attention probabilities
    gradients.router,
    saliency.router,
    interventions.router,
    introspect.router,
    nodes.router,  # /models/{name}/nodes: FX graph nodes
    checkpoints.router,
    jobs.router,  # /jobs: data-set jobs (admin)
    metrics.router,
    v2.router,  # /v2: the Open Inference Protocol, with its own error envelope
    torchserve.router,  # /ping, /predictions, /explanations: TorchServe's inference API, with its envelope
    docs.router,  # /docs and /redoc with their assets served from the package (offline)
    ui.router,  # /ui, the inspector page
)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        fleet = Fleet(settings, on_job=job_observer(app), on_remove=removal_observer(app))
        pool = ThreadPoolExecutor(
            max_workers=max(1, settings.decode_threads),
            thread_name_prefix="hookserve-decode",
            initializer=start_decode_thread,
        )
        uploads = UploadSlots(settings.max_concurrent_uploads, settings.max_upload_scratch_bytes)
        uploads.start()
        plane = DataPlane(settings, fleet, pool)
        jobs_manager = JobManager(settings, plane)
        state = AppState(settings=settings, fleet=fleet, plane=plane, uploads=uploads, jobs=jobs_manager)
        app.state.hookserve = state
        if settings.config is not None:
            for spec in load_specs(Path(settings.config)):
                fleet.add(spec)
        else:
            for spec in builtin_specs():
                fleet.add(spec, root=ZOO_DIR if spec.weights is not None else None)  # shipped weights
        jobs_manager.resume()  # jobs the last server left running go on from their checkpoints
        try:
            async with side_fronts(app, state):  # gRPC and TorchServe's management API, on their own ports
                yield
        finally:
            state.draining = True
            await jobs_manager.close()  # before the fleet: running jobs stay `running`, to resume on the next start
            await fleet.close()
            pool.shutdown(wait=False, cancel_futures=True)
            uploads.close()

    app = FastAPI(
        title="hookserve",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # /docs and /redoc come from routes.docs, with assets served locally
        redoc_url=None,
        openapi_tags=[
            {"name": "health"},
            {"name": "models", "description": "The registry and what each model is."},
            {"name": "inference", "description": "What does the model say?"},
            {"name": "introspection", "description": "Why, and what happens inside?"},
            {"name": "experiments", "description": "What if? Edit what happens inside and watch the answer move."},
            {"name": "jobs", "description": "Data-set jobs: unit statistics and exemplars over a whole data set."},
        ],
    )
    install_error_handlers(app)
    install_openapi(app)
    for router in ROUTERS:
        app.include_router(router)
    app.add_middleware(
        BodyLimitMiddleware,
        limit=settings.max_body_bytes,
        upload_limit=settings.max_upload_bytes,
        upload_paths=UPLOAD_PATHS,
        envelopes=ENVELOPES,
    )
    app.add_middleware(CancelOnDisconnectMiddleware, watched=runs_a_model)  # a client leaving abandons its job
    app.add_middleware(ReleaseWhenAnsweredMiddleware)  # memory held for a request lasts until it is answered
    if settings.cors_origins:  # outside the body limit, so a browser can read its 413
        app.add_middleware(
            CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"], allow_headers=["*"]
        )
    notice = ShutdownNotice()  # `python -m service` cuts what still runs when the shutdown grace period ends
    app.state.shutdown_notice = notice
    app.add_middleware(AnswerWhenCutMiddleware, notice=notice, envelopes=ENVELOPES)
    install_observability(app, settings)  # sees every request, 413s included
    app.add_middleware(EveryAnswerHeadersMiddleware)  # outermost: every answer, whoever wrote it
    return app
