"""What a request will hold in memory, from the model's layer shapes at its input size, before any work.

Estimates, on purpose generous: the decoded inputs; a forward's live activations (a layer's
input and output at the widest layer); what is captured (every requested key and side,
before any reduction); what autograd keeps (every layer output from where the graph starts);
and the answer in its format (JSON numbers take about 12 bytes each, an npz file a copy of
its tensors, a safetensors file nothing more: it is sent from the tensors themselves). A
request is refused or made to wait on these numbers; the answer limits are checked on them
too, so a 413 for an answer too large comes before the forward, not after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from service.codecs.tensors import JSON_NUMBER_MOST, json_size_upper_bound
from service.config import Settings
from service.errors import TooLarge
from service.introspection.attention import AttentionSite
from service.introspection.shapes import LayerShapes
from service.runtime.admission import Cost
from service.runtime.runners.activations import CaptureRequest
from service.specs.vocab import Capture

JSON_BYTES_PER_NUMBER = 12  # "-0.12345678," as orjson writes a float32
_SIDES = {Capture.output: ("output",), Capture.input: ("input",), Capture.both: ("input", "output")}

ADVICE_ACTIVATIONS = "ask for fewer layers or inputs, a reduce (mean/max), format=stats, or a smaller input"
ADVICE_GRADIENTS = "ask for fewer layers or inputs, include_input=false, or a smaller input"
ADVICE_SALIENCY = "send fewer or smaller inputs"
ADVICE_PREDICT = "send fewer or smaller inputs"
ADVICE_ATTENTION = "ask for fewer blocks, heads or inputs, the class token's row (the default) or format=stats"


@dataclass(frozen=True)
class Estimate:
    """A request's memory, and the size of the tensors its answer will carry (for the answer limits)."""

    cost: Cost
    answer_numel: int = 0
    answer_bytes: int = 0
    rows_per_forward: int | None = None  # rows one forward sees, when chosen to fit the memory limit (chunking.py)


def inputs_bytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


def forward_bytes(shapes: LayerShapes, n: int) -> int:
    """A plain forward's live activations: about a layer's input and output at the widest layer."""
    return 2 * n * shapes.largest_output_bytes()


def graph_bytes(shapes: LayerShapes, n: int, start_keys: Sequence[str] | None) -> int:
    """What autograd keeps for a backward: every layer output from the first of `start_keys` on
    (None: from the input, every layer)."""
    keys = list(shapes.outputs)
    if start_keys:
        first = min((keys.index(k) for k in start_keys if k in keys), default=0)
        keys = keys[first:]
    return n * shapes.output_bytes(keys)


def predict_cost(x: torch.Tensor, shapes: LayerShapes) -> Estimate:
    n = int(x.shape[0])
    return Estimate(Cost({"inputs": inputs_bytes(x), "forward": forward_bytes(shapes, n)}))


def activations_cost(
    x: torch.Tensor, shapes: LayerShapes, request: CaptureRequest, fmt: str, node_bytes: int = 0
) -> Estimate:
    """`node_bytes`: one sample's functional-node captures (at the traced size; scaled like the layers')."""
    n = int(x.shape[0])
    keys = shapes.keys_of(request.layers)
    sides = _SIDES[request.capture]
    reduced = request.reduce is not None
    nodes = int(node_bytes * shapes.area)
    numel = n * (shapes.numel(keys, sides) + nodes // max(1, x.element_size()))
    layers = sum(shapes.output_bytes(keys) if side == "output" else shapes.input_bytes(keys) for side in sides)
    captured = n * (layers + nodes)
    carried = not reduced and fmt not in ("stats", "png")
    answer = _answer_bytes(numel, captured, fmt) if carried else 0
    parts = {"inputs": inputs_bytes(x), "forward": forward_bytes(shapes, n), "captures": captured, "answer": answer}
    return Estimate(Cost(parts), numel if carried else 0, captured if carried else 0)


def gradients_cost(
    x: torch.Tensor, shapes: LayerShapes, layers: Sequence[str], include_input: bool, fmt: str
) -> Estimate:
    n = int(x.shape[0])
    keys = shapes.keys_of(tuple(layers))
    grads = n * shapes.output_bytes(keys) + (inputs_bytes(x) if include_input else 0)
    graph = graph_bytes(shapes, n, None if include_input else keys)
    numel = n * shapes.numel(keys, ("output",)) + (x.numel() if include_input else 0)
    parts = {"inputs": inputs_bytes(x), "graph": graph, "gradients": grads, "answer": _answer_bytes(numel, grads, fmt)}
    return Estimate(Cost(parts), numel, grads)


def saliency_cost(
    x: torch.Tensor,
    shapes: LayerShapes,
    chunk: int | None,
    graph_from: str | None,
    fmt: str,
    *,
    rows_per_input: int | None = None,
) -> Estimate:
    """`chunk`: rows (inputs, or noisy/interpolated copies) one forward sees at most; `rows_per_input`: how many
    rows each input becomes, when known (a forward never sees more than all of them); `graph_from`: a layer, ""
    for the input, None for methods that differentiate from the input in chunks (their own forwards)."""
    n = int(x.shape[0])
    if graph_from is None:
        rows = n if chunk is None else max(1, chunk)
        if rows_per_input is not None:
            rows = min(rows, n * rows_per_input)
        graph = graph_bytes(shapes, rows, None)
    else:
        graph = graph_bytes(shapes, n, [graph_from] if graph_from else None)
    attribution = 2 * inputs_bytes(x)  # the attributions and their input-sized heatmaps
    numel = 2 * x.numel()
    carried = fmt != "png"
    answer = _answer_bytes(numel, attribution, fmt) if carried else 0
    parts = {"inputs": inputs_bytes(x), "graph": graph, "attributions": attribution, "answer": answer}
    return Estimate(Cost(parts), numel if carried else 0, attribution if carried else 0)


def attention_cost(
    x: torch.Tensor,
    shapes: LayerShapes,
    sites: Sequence[AttentionSite],
    heads: Sequence[int] | None,
    queries: Sequence[int] | None,
    *,
    fmt: str,
) -> Estimate:
    """The forward, each unfused block's scores and probabilities `[N, heads, T, T]` (one block at a time), the
    kept rows of every chosen block, and the answer: T is read from the tokens each attention module takes."""
    n = int(x.shape[0])
    full = kept = numel = 0
    for site in sites:
        tokens = _tokens_into(shapes, site.name)
        rows = len(queries) if queries is not None else tokens
        full = max(full, 2 * n * site.heads * tokens * tokens * 4)
        kept += n * site.heads * rows * tokens * 4
        numel += n * (len(heads) if heads is not None else site.heads) * rows * tokens
    carried = fmt not in ("stats", "png")
    answer = _answer_bytes(numel, numel * 4, fmt) if carried else 0
    forward = forward_bytes(shapes, n) + full
    parts = {"inputs": inputs_bytes(x), "forward": forward, "captures": kept, "answer": answer}
    return Estimate(Cost(parts), numel if carried else 0, numel * 4 if carried else 0)


def _tokens_into(shapes: LayerShapes, name: str) -> int:
    """How many tokens the module `name` takes (its first input `[1, T, D]`, scaled to the request's input)."""
    found = shapes.inputs.get(name, [])
    if not found or len(found[0].shape) != 3:
        return 1
    return max(1, found[0].per_sample_numel // max(1, found[0].shape[-1]))


def check_answer(estimate: Estimate, fmt: str, settings: Settings, advice: str) -> None:
    """The answer-size limits, checked on the estimate before any work. JSON by the most its numbers can take
    (`JSON_NUMBER_MOST` bytes each), so no answer is refused for its size after the work was done."""
    most = json_size_upper_bound(estimate.answer_numel)
    if fmt == "json" and most > settings.max_json_response_bytes:
        raise TooLarge(
            f"the JSON answer's {estimate.answer_numel} numbers could take {most} bytes ({JSON_NUMBER_MOST} each), "
            f"over the {settings.max_json_response_bytes}-byte limit (max_json_response_bytes); {advice}, or a "
            "binary format (safetensors/npz)"
        )
    if fmt in ("safetensors", "npz") and estimate.answer_bytes > settings.max_binary_response_bytes:
        raise TooLarge(
            f"the binary answer would be {estimate.answer_bytes} bytes, over the "
            f"{settings.max_binary_response_bytes}-byte limit (max_binary_response_bytes); {advice}"
        )


def _answer_bytes(numel: int, raw: int, fmt: str) -> int:
    """Memory the encoded answer takes beyond its tensors: none for safetensors, sent from the tensors' own
    bytes (`service.codecs.binary.safetensors_parts`); a copy for npz and npy; ~12 bytes a number for JSON."""
    if fmt == "json":
        return numel * JSON_BYTES_PER_NUMBER
    if fmt == "safetensors":
        return 0
    return raw
