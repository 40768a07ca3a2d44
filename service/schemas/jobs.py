"""POST /jobs and what GET /jobs answers: data-set jobs (unit statistics, exemplars, similarity) run on the server."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.specs.vocab import JobKindName, JobState

Finite = Annotated[float, Field(allow_inf_nan=False)]


class JobParameters(BaseModel):
    """What the kind needs beyond its layers; each field belongs to one kind, and the others ignore it."""

    model_config = ConfigDict(extra="forbid")

    bins: int = Field(32, ge=1, le=1024, description="unit_stats: histogram buckets per unit.")
    range: list[Finite] | None = Field(
        None,
        min_length=2,
        max_length=2,
        description="unit_stats: the histogram's [lo, hi]; absent: the first chunk's min and max over each layer. "
        "Values outside are counted as `under` and `over`.",
    )
    k: int = Field(9, ge=1, le=256, description="exemplars: samples kept per unit.")
    score: Literal["max", "mean"] = Field(
        "max", description="exemplars: rank samples by the unit's max or mean over positions."
    )
    reduce: Literal["mean", "flatten"] = Field(
        "mean",
        description="similarity and features: each sample's features per layer, each unit's mean over its "
        "positions or every value (similarity keeps the cross-covariance of all features: its size grows with "
        "their count squared).",
    )
    shard_size: int = Field(1024, ge=1, le=65536, description="features: samples per shard file.")

    positive: str | None = Field(
        None,
        min_length=1,
        description="steering_vector: the class whose mean the vector points towards.",
        examples=["1"],
    )
    negative: str | None = Field(
        None, min_length=1, description="steering_vector: the class whose mean it points away from.", examples=["7"]
    )
    name: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="steering_vector: the name the vector is stored under; /interventions adds it with "
        '`{"op": "add", "vector": name, "scale": 2.0}`.',
    )

    @model_validator(mode="after")
    def _range(self) -> JobParameters:
        if self.range is not None and not self.range[0] < self.range[1]:
            raise ValueError("range must be [lo, hi] with lo < hi")
        return self


class JobRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: JobKindName = Field(
        ...,
        description="unit_stats: per-unit statistics; exemplars: top-k samples per unit; similarity: linear CKA "
        "between every pair of the layers, exact over the data set; steering_vector: the difference of one layer's "
        "mean output between two classes, stored by name for /interventions; features: every sample's reduced "
        "activations as safetensors shards in the format of `hookserve features`, downloadable.",
    )
    model: str = Field(..., min_length=1, examples=["lenet"])
    dataset: str = Field(
        ...,
        min_length=1,
        max_length=1024,
        description="`digits` (scikit-learn's, built in) or a folder under HOOKSERVE_DATA_DIR whose subfolders "
        "are the classes.",
        examples=["digits"],
    )
    layers: list[str] = Field(
        ..., min_length=1, max_length=256, description="Layer names or patterns, as /activations takes them."
    )
    limit: int | None = Field(None, ge=1, description="Only the data set's first `limit` samples (in its order).")
    parameters: JobParameters = Field(default_factory=JobParameters)


class FileError(BaseModel):
    index: int = Field(..., description="The sample's index in the data set.")
    file: str | None = Field(None, description="Its path relative to the data set (absent for built-in sets).")
    detail: str


class JobInfo(BaseModel):
    id: str
    kind: JobKindName
    model: str
    dataset: str
    layers: list[str] = Field(..., description="The layers the patterns resolved to.")
    parameters: JobParameters
    state: JobState
    done: int = Field(..., description="Samples processed (read, or listed in `errors`).")
    total: int = Field(..., description="Samples the job reads.")
    progress: float = Field(..., description="done / total, 0..1.")
    rate: float | None = Field(None, description="Samples per second since the job (re)started.")
    eta_s: float | None = Field(None, description="Seconds left at that rate.")
    resumed_from: int | None = Field(
        None, description="When a restarted server resumed the job: the samples done at the checkpoint it went on from."
    )
    errors: list[FileError] = Field(default_factory=list, description="Samples skipped (unreadable files), first 100.")
    error_count: int = 0
    error: str | None = Field(None, description="Why a failed job failed.")
    created: float = Field(..., description="Unix time.")
    started: float | None = None
    finished: float | None = None


class JobList(BaseModel):
    jobs: list[JobInfo]


class PairSide(BaseModel):
    class_: str = Field(..., alias="class", description="The class's name in the data set.")
    count: int = Field(..., description="Its samples the mean was taken over.")


class VectorInfo(BaseModel):
    """A stored steering vector: where it applies and how it was made (its values stay on the server)."""

    name: str
    model: str
    layer: str = Field(..., description="The capture key it was taken at (`name`, or `name#2` for a later call).")
    shape: list[int] = Field(..., description="One sample's output shape at that layer.")
    norm: float = Field(..., description="Its L2 norm.")
    job: str = Field(..., description="The steering_vector job that made it.")
    dataset: str
    positive: PairSide
    negative: PairSide


class VectorList(BaseModel):
    vectors: list[VectorInfo]
