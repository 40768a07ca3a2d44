"""A fleet entry as the INFO that GET /models and friends answer."""

from __future__ import annotations

from service.introspection.attention import fused_flags
from service.introspection.hooks import count_hooks
from service.introspection.tokens import token_layout
from service.registry.loaded import LoadedModel
from service.runtime.fleet import Entry
from service.schemas.models import ModelDetail, ModelInfo


def model_info(entry: Entry) -> ModelInfo:
    return ModelInfo.model_validate(_fields(entry))


def model_detail(entry: Entry) -> ModelDetail:
    fields = _fields(entry)
    fields["repr"] = entry.model.text if entry.model is not None else None
    return ModelDetail.model_validate(fields)


def attention_info(model: LoadedModel) -> dict[str, object] | None:
    """The attention modules /attention reads, their heads, the tokens at the input size, the predictions' kernel."""
    sites = model.attention.sites
    if not sites:
        return None
    layout = token_layout(model.module, tuple(model.input_size))
    flags = fused_flags(model.prediction_module) if model.prediction_path != "onnxruntime" else {}
    return {
        "modules": list(sites),
        "heads": [site.heads for site in sites.values()],
        "tokens": layout.describe() if layout is not None else None,
        "fused": all(flags.values()) if flags else None,
    }


def _fields(entry: Entry) -> dict[str, object]:
    spec, model = entry.spec, entry.model
    weights = "random" if spec.weights is None else spec.weights
    fields: dict[str, object] = {
        "name": spec.name,
        "source": spec.source.value,
        "architecture": spec.architecture,
        "status": entry.status.value,
        "error": entry.error,
        "dtype": spec.dtype.value,
        "memory_format": spec.memory_format.value,
        "weights": weights,
        "labels": spec.labels is not None,
        "optimizer": spec.optimizer.type if spec.optimizer is not None else None,
        "input_size": spec.input_size,
        "preprocess": spec.preprocess,
        "load_seconds": entry.load_seconds,
    }
    if model is not None:
        fields |= {
            "device": str(model.device),
            "memory_format": "channels_last" if model.channels_last else "contiguous",
            "weights": model.weights,
            "num_parameters": model.num_parameters,
            "trainable_parameters": model.trainable_parameters,
            "input_size": model.input_size,
            "preprocess": model.preprocess,
            "num_classes": model.num_classes,
            "labels": model.labels is not None,
            "optimizer": type(model.optimizer).__name__ if model.optimizer is not None else None,
            "hooks": sum(count_hooks(m) for m in model.hookable_modules),
            "prediction_path": model.prediction_path,
            "prediction_path_reason": model.prediction_path_reason or None,
            "hook_lanes": len(model.lanes),
            "packed_convolutions": model.conv_packs is not None,
            "packed_convolutions_reason": model.conv_packs_reason or None,
            "attention": attention_info(model),
            "attention_reason": model.attention.refusal(model.name),
            "capture_plans": model.capture_plans.info(),
        }
    return fields
