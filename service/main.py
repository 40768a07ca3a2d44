"""The application factory: `create_app(settings)`; the lifespan owns registry and pools."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from service import __version__
from service.api import activations, attribution, checkpoints, health, introspect, models, predict, v2
from service.api.errors import install_error_handlers
from service.api.limits import BodyLimitMiddleware
from service.api.metrics import job_observer, removal_observer
from service.api.observability import install_observability
from service.api.openapi import install_openapi
from service.api.routes import docs, ui
from service.api.state import AppState
from service.config import Settings
from service.registry.builtin import ZOO_DIR, builtin_specs
from service.registry.registry import Registry
from service.registry.spec import load_specs
from service.runtime.threads import pin_torch_threads

log = logging.getLogger("hookserve")

DESCRIPTION = """\
Inference **and** introspection for PyTorch models over HTTP: predictions with dynamic
batching, per-layer activations from request-scoped hooks, gradients and saliency maps
(Captum), torchinfo summaries, state-dict, optimizer and checkpoint metadata.

[The inspector](/ui) shows all of it on one page; [ReDoc](/redoc) renders this schema too.
"""

UPLOAD_PATHS = ("/checkpoints/inspect",)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        registry = Registry(settings, on_job=job_observer(app), on_remove=removal_observer(app))
        pool = ThreadPoolExecutor(
            max_workers=max(1, settings.decode_threads),
            thread_name_prefix="hookserve-decode",
            initializer=pin_torch_threads,  # only the wide runner may use several torch threads
            initargs=(1,),
        )
        state = AppState(settings=settings, registry=registry, decode_pool=pool)
        app.state.hookserve = state
        if settings.config is not None:
            for spec in load_specs(Path(settings.config)):
                registry.add(spec)
        else:
            for spec in builtin_specs():
                registry.add(spec, root=ZOO_DIR if spec.name == "lenet" else None)
        try:
            yield
        finally:
            state.draining = True
            await registry.close()
            pool.shutdown(wait=False, cancel_futures=True)

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
        ],
    )
    install_error_handlers(app)
    install_openapi(app)
    for router in (
        health.router,
        models.router,
        predict.router,
        activations.router,
        attribution.router,
        introspect.router,
        checkpoints.router,
        v2.router,
        docs.router,
        ui.router,
    ):
        app.include_router(router)
    app.add_middleware(
        BodyLimitMiddleware,
        limit=settings.max_body_bytes,
        upload_limit=settings.max_upload_bytes,
        upload_paths=UPLOAD_PATHS,
    )
    if settings.cors_origins:  # outside the body limit, so a browser can read its 413
        app.add_middleware(
            CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"], allow_headers=["*"]
        )
    install_observability(app, settings)  # outermost: sees every request, 413s included
    return app
