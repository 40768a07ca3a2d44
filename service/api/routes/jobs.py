"""/jobs: data-set jobs (unit statistics, exemplars, similarity, steering vectors), run on the server in the
background, and /vectors: the steering vectors they stored. Admin only:
a job spends minutes of compute and reads server-side data."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, JSONResponse

from service.api.auth import require_admin
from service.api.bodies import read_json, validate
from service.api.deps import JobsDep
from service.api.openapi import error_responses, json_body
from service.jobs.store import JobRow
from service.registry.steering_vectors import SteeringVector
from service.schemas.jobs import FileError, JobInfo, JobList, JobParameters, JobRequest, VectorInfo, VectorList
from service.specs.vocab import JobKindName, JobState

router = APIRouter(tags=["jobs"], dependencies=[Depends(require_admin)])


def job_info(row: JobRow) -> JobInfo:
    running = row.state is JobState.running
    left = row.total - row.done
    return JobInfo(
        id=row.id,
        kind=JobKindName(row.kind),
        model=row.model,
        dataset=row.dataset,
        layers=row.layers,
        parameters=JobParameters.model_validate(row.parameters),
        state=row.state,
        done=row.done,
        total=row.total,
        progress=row.done / row.total if row.total else 1.0,
        rate=row.rate if running else None,
        eta_s=left / row.rate if running and row.rate else None,
        resumed_from=row.resumed_from,
        errors=[FileError.model_validate(e) for e in row.errors],
        error_count=row.error_count,
        error=row.error,
        created=row.created,
        started=row.started,
        finished=row.finished,
    )


@router.post(
    "/jobs",
    status_code=202,
    response_model=JobInfo,
    summary="Start a data-set job (admin)",
    responses=error_responses(400, 401, 403, 404, 409, 413, 422),
    openapi_extra=json_body(JobRequest),
)
async def start_job(request: Request, jobs: JobsDep) -> JSONResponse:
    """The body is read only after the token is checked. 202: the job is queued; poll GET /jobs/{id}."""
    body = validate(JobRequest, await read_json(request))
    info = job_info(await jobs.submit(body))
    return JSONResponse(info.model_dump(mode="json"), status_code=202, headers={"Location": f"/jobs/{info.id}"})


@router.get(
    "/jobs", response_model=JobList, summary="Every job, oldest first (admin)", responses=error_responses(401, 403)
)
async def list_jobs(jobs: JobsDep) -> JobList:
    return JobList(jobs=[job_info(row) for row in jobs.all()])


@router.get(
    "/jobs/{job_id}",
    response_model=JobInfo,
    summary="A job's state and progress (admin)",
    responses=error_responses(401, 403, 404),
)
async def get_job(job_id: str, jobs: JobsDep) -> JobInfo:
    return job_info(jobs.get(job_id))


@router.delete(
    "/jobs/{job_id}",
    response_model=JobInfo,
    summary="Cancel a queued or running job, or delete a finished one with its files (admin)",
    responses=error_responses(401, 403, 404),
)
async def cancel_job(job_id: str, jobs: JobsDep) -> JobInfo:
    return job_info(await jobs.cancel(job_id))


@router.get(
    "/jobs/{job_id}/result",
    summary="A succeeded job's result, JSON (admin)",
    responses={200: {"content": {"application/json": {}}}, **error_responses(401, 403, 404, 409)},
)
async def job_result(job_id: str, jobs: JobsDep) -> Response:
    return Response(await jobs.result(job_id), media_type="application/json")


MEDIA_TYPES = {".json": "application/json", ".safetensors": "application/octet-stream"}


@router.get(
    "/jobs/{job_id}/files/{name}",
    summary="A file a succeeded job wrote: a features job's index.json and shards (admin)",
    responses={
        200: {"content": {"application/octet-stream": {}, "application/json": {}}},
        **error_responses(401, 403, 404, 409),
    },
)
async def job_file(job_id: str, name: str, jobs: JobsDep) -> FileResponse:
    path = jobs.file(job_id, name)
    return FileResponse(path, media_type=MEDIA_TYPES.get(path.suffix, "application/octet-stream"))


@router.get(
    "/jobs/{job_id}/exemplars.png",
    summary="An exemplars job's top samples of one unit, each with the unit's map over it (admin)",
    responses={200: {"content": {"image/png": {}}}, **error_responses(401, 403, 404, 409, 422)},
)
async def exemplar_maps(
    job_id: str,
    jobs: JobsDep,
    layer: Annotated[str, Query(min_length=1, description="A layer the job ranked (a capture key: `relu#2`).")],
    unit: Annotated[int, Query(ge=0, description="The unit (channel).")],
    alpha: Annotated[float, Query(ge=0.0, le=1.0, description="The maps' opacity over the images.")] = 0.5,
) -> Response:
    """Tiles in rank order; every map on one scale (the unit's min to max over these samples)."""
    return Response(await jobs.exemplar_maps(job_id, layer, unit, alpha), media_type="image/png")


def vector_info(vector: SteeringVector) -> VectorInfo:
    return VectorInfo.model_validate(vector.info())


@router.get(
    "/vectors",
    response_model=VectorList,
    summary="Stored steering vectors (admin)",
    responses=error_responses(401, 403),
)
async def list_vectors(jobs: JobsDep) -> VectorList:
    return VectorList(vectors=[vector_info(v) for v in await run_in_threadpool(jobs.vectors.all)])


@router.get(
    "/vectors/{name}",
    response_model=VectorInfo,
    summary="One steering vector: its model, layer, shape, norm and how it was made (admin)",
    responses=error_responses(401, 403, 404, 422),
)
async def get_vector(name: str, jobs: JobsDep) -> VectorInfo:
    return vector_info(await run_in_threadpool(jobs.vectors.get, name))


@router.delete(
    "/vectors/{name}",
    response_model=VectorInfo,
    summary="Delete a steering vector (admin)",
    responses=error_responses(401, 403, 404, 422),
)
async def delete_vector(name: str, jobs: JobsDep) -> VectorInfo:
    return vector_info(await run_in_threadpool(jobs.vectors.delete, name))
