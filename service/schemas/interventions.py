"""POST /interventions and POST /interventions/sweep: edits as data (a closed set of ops), never code."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.schemas.attribution import TARGET_DESCRIPTION, TargetField
from service.schemas.common import InputItem, ModelInputs, TensorPayload
from service.schemas.examples import SAMPLE_INPUTS
from service.schemas.predict import Prediction
from service.schemas.tokens import Index, TokenChoice
from service.specs.vocab import ActivationFormat, Capture, Reduce

Finite = Annotated[float, Field(allow_inf_nan=False)]
Span = Annotated[list[int], Field(min_length=2, max_length=2, description="[start, stop) along that axis.")]


class EditSite(BaseModel):
    """Where an edit applies: a module's output (one call of it) or a functional node's, and which part of it."""

    model_config = ConfigDict(extra="forbid")

    site: str | None = Field(None, min_length=1, description="A module path from /layers.", examples=["conv2"])
    node: str | None = Field(
        None, min_length=1, description="Or a functional node from /nodes (e.g. `layer1.0.add`).", examples=["add"]
    )
    call: int = Field(1, ge=1, le=1024, description="Which call of a module that runs several times (2 = `name#2`).")
    channels: list[int] | None = Field(None, max_length=65536, description="Channel indices (dim 1); all if absent.")
    y: Span | None = Field(None, description="Rows [start, stop) of a spatial output (dim -2).")
    x: Span | None = Field(None, description="Columns [start, stop) of a spatial output (dim -1).")
    tokens: TokenChoice | None = Field(
        None,
        description="Tokens along dim 1 of a vision transformer's [N, T, D] output: indices in the whole sequence, "
        "`patches` or `prefix`. On such an output `channels` index the last dim (D).",
    )
    heads: list[Index] | None = Field(
        None,
        min_length=1,
        max_length=1024,
        description="Heads of the attention module `site` names (e.g. `blocks.3.attn`): the edit applies to their "
        "outputs where the heads meet, before the output projection (zero or scale a head's contribution, patch "
        "it from a donor run); `tokens` may narrow it to some query tokens.",
    )

    @model_validator(mode="after")
    def _spans(self) -> EditSite:
        if (self.site is None) == (self.node is None):
            raise ValueError("give exactly one of 'site' (a module) or 'node' (a functional node)")
        if self.node is not None and self.call != 1:
            raise ValueError("'call' numbers the calls of a module; a node runs once")
        for name, span in (("y", self.y), ("x", self.x)):
            if span is not None and not 0 <= span[0] < span[1]:
                raise ValueError(f"{name} must be [start, stop) with 0 <= start < stop")
        if self.channels is not None and any(c < 0 for c in self.channels):
            raise ValueError("channels must be non-negative indices")
        if self.heads is not None and (self.node is not None or self.channels is not None):
            raise ValueError("'heads' edits the heads of the attention module 'site' names (their channels follow)")
        if (self.tokens is not None or self.heads is not None) and (self.y is not None or self.x is not None):
            raise ValueError("'y' and 'x' select spatial dims; a token sequence is addressed by 'tokens'")
        return self


class ZeroEdit(EditSite):
    op: Literal["zero"]


class ScaleEdit(EditSite):
    op: Literal["scale"]
    factor: Finite = Field(..., description="Multiply the selection by this.")


class AddEdit(EditSite):
    """Steering: add a scalar, a tensor shaped like one sample's selection (or one value per selected channel), or a
    stored steering vector by name (times `scale`)."""

    op: Literal["add"]
    value: Finite | None = None
    tensor: TensorPayload | None = None
    vector: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="A stored steering vector (GET /vectors), made by a steering_vector job; it applies at the "
        "model and layer it was taken at.",
    )
    scale: Finite = Field(1.0, description="vector: added times this.")

    @model_validator(mode="after")
    def _one(self) -> AddEdit:
        if sum(given is not None for given in (self.value, self.tensor, self.vector)) != 1:
            raise ValueError("add takes exactly one of 'value', 'tensor' or 'vector'")
        return self


class ClampEdit(EditSite):
    op: Literal["clamp"]
    min: Finite | None = None
    max: Finite | None = None

    @model_validator(mode="after")
    def _bounds(self) -> ClampEdit:
        if self.min is None and self.max is None:
            raise ValueError("clamp needs 'min', 'max' or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError("clamp's min is above its max")
        return self


class MeanEdit(EditSite):
    """Mean ablation: the selection replaced by its mean over the spatial dims, or over the request's clean inputs."""

    op: Literal["mean"]
    over: Literal["spatial", "batch"] = "spatial"


class NoiseEdit(EditSite):
    op: Literal["noise"]
    std: Finite = Field(..., gt=0, le=1e6)
    seed: int = Field(0, ge=0, le=2**63 - 1, description="The same seed gives the same noise.")


class PatchEdit(EditSite):
    """Activation patching: the selection taken from the same site of a named source run."""

    op: Literal["patch"]
    source: str = Field(..., min_length=1, description="A name in `sources`.")


class SetEdit(EditSite):
    op: Literal["set"]
    tensor: TensorPayload = Field(..., description="Shaped like one sample's selection.")


Edit = Annotated[
    ZeroEdit | ScaleEdit | AddEdit | ClampEdit | MeanEdit | NoiseEdit | PatchEdit | SetEdit,
    Field(discriminator="op"),
]


class InterventionsRequest(ModelInputs):
    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {
                    "model": "lenet",
                    "inputs": SAMPLE_INPUTS,
                    "edits": [{"site": "conv2", "op": "zero", "channels": [0, 3, 7]}],
                    "layers": ["fc3"],
                }
            ]
        },
    )

    edits: list[Edit] = Field(..., min_length=1, description="Applied in order, in one forward (limit max_edits).")
    sources: dict[str, list[InputItem]] = Field(
        default_factory=dict,
        description="Donor runs for `patch` edits: one input (used for every base input) or as many as `inputs`.",
    )
    target: TargetField = Field(None, description=TARGET_DESCRIPTION + " The score whose change is reported.")
    top_k: int = Field(5, ge=1, le=1000)
    include_logits: bool = False
    layers: list[str] = Field(default_factory=list, description="Layers to capture after the edits (as /activations).")
    nodes: list[str] = Field(
        default_factory=list, description="Functional nodes to capture after the edits, when the edits are at nodes."
    )
    capture: Capture = Capture.output
    reduce: Reduce | None = None
    format: ActivationFormat = Field(ActivationFormat.json, description="How captures come back (as /activations).")


class SweepRequest(ModelInputs):
    """Ablate each channel of one layer in turn and rank the channels by their effect on the target score."""

    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={"examples": [{"model": "lenet", "inputs": SAMPLE_INPUTS, "site": "conv2", "target": 7}]},
    )

    site: str = Field(..., min_length=1, description="A module path from /layers.")
    call: int = Field(1, ge=1, le=1024)
    op: Literal["zero", "mean"] = Field("zero", description="zero the channel, or replace it by its spatial mean.")
    over: Literal["channels", "heads"] = Field(
        "channels",
        description="Sweep channels, or the heads of the attention module `site` names (`blocks.3.attn`); a head's "
        "mean is over the tokens, as is a channel's of a token sequence.",
    )
    channels: Span | None = Field(None, description="[start, stop) of the channels to sweep; all if absent.")
    heads: Span | None = Field(None, description="over=heads: [start, stop) of the heads to sweep; all if absent.")
    target: TargetField = Field(None, description=TARGET_DESCRIPTION)

    @model_validator(mode="after")
    def _ranges(self) -> SweepRequest:
        if self.over == "channels" and self.heads is not None:
            raise ValueError("'heads' is the range of a sweep over heads: set over=heads")
        if self.over == "heads" and self.channels is not None:
            raise ValueError("a sweep over heads takes its range in 'heads'")
        return self


class Change(BaseModel):
    target: int
    label: str
    clean_score: float = Field(..., description="The target's logit without the edits.")
    edited_score: float
    delta: float = Field(..., description="edited_score - clean_score.")
    kl_divergence: float = Field(..., description="KL(clean softmax || edited softmax).")


class Applied(BaseModel):
    edit: int = Field(..., description="The edit's index in `edits`.")
    site: str
    call: int
    op: str
    shape: list[int] = Field(..., description="The site's output shape for one input.")
    elements: int = Field(..., description="Elements of one input's output the edit changed.")
    heads: list[int] | None = Field(None, description="The attention heads edited.")
    tokens: list[int] | None = Field(None, description="The tokens edited (positions along dim 1).")


class InterventionsResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model: str
    clean: list[Prediction]
    edited: list[Prediction]
    change: list[Change]
    applied: list[Applied]
    activations: dict[str, dict[str, Any]] | None = Field(None, description="Captures after the edits, if asked.")


class HeadEffect(BaseModel):
    head: int
    delta: float = Field(..., description="Mean over the inputs of the target score's change when it is ablated.")
    deltas: list[float] = Field(..., description="The change for each input.")


class ChannelEffect(BaseModel):
    channel: int
    delta: float = Field(..., description="Mean over the inputs of the target score's change when it is ablated.")
    deltas: list[float] = Field(..., description="The change for each input.")


class SweepResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model: str
    site: str
    call: int
    op: str
    targets: list[int]
    clean_scores: list[float]
    over: Literal["channels", "heads"] = "channels"
    channels: list[ChannelEffect] = Field(..., description="Sorted: the most negative change (the most needed) first.")
    heads: list[HeadEffect] | None = Field(None, description="over=heads: sorted as channels are (channels is empty).")
