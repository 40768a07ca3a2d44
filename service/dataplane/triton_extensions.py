"""Triton's model configuration and statistics extensions: what a served model is and what it has done.

`model_config` describes the model as Triton's `config.pbtxt` would (the PyTorch backend's platform,
`input__0` / `output__N` with their datatypes and dims without the batch dimension, the batching
and queue settings it is served with, where it runs); `model_statistics` reads the counters the
model's executor keeps (`service.runtime.statistics`). Both fronts (REST and gRPC) encode these
with `service.codecs.triton_extensions`, so they answer the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath

from service.codecs.oip_infer import INPUT_NAME, TensorInfo, datatype_of
from service.codecs.triton_extensions import ConfigTensor, ModelConfigInfo
from service.dataplane.base import PlaneBase
from service.dataplane.oip import VERSIONS, check_version, output_info
from service.runtime.fleet import Status
from service.runtime.statistics import Statistics

IMAGE_FORMAT = "FORMAT_NCHW"  # the layout of a [C, H, W] input (whatever memory format the model runs in)


@dataclass(frozen=True)
class NamedStatistics:
    name: str
    version: str
    statistics: Statistics


class TritonExtensions(PlaneBase):
    async def model_config(self, name: str, version: str | None) -> ModelConfigInfo:
        check_version(name, version)
        served = self.ready(name)
        model, config = served.model, served.executor.config
        image = len(model.input_size) == 3
        inputs = [_tensor(TensorInfo(INPUT_NAME, datatype_of(model.dtype), [-1, *model.input_size]), image)]
        outputs = [_tensor(info, False) for info in await output_info(served)]
        if model.labels and outputs:  # the labels the classification extension answers with
            label_file = PurePath(model.spec.labels).name if model.spec.labels else "labels.txt"
            outputs[0] = ConfigTensor(outputs[0].name, outputs[0].datatype, outputs[0].dims, label_filename=label_file)
        device = model.device
        spec = model.spec
        parameters = {
            "source": spec.source.value,
            "architecture": spec.architecture,
            "device": str(device),
            "dtype": str(model.dtype).removeprefix("torch."),
            "prediction_path": model.prediction_path,
        }
        return ModelConfigInfo(
            name=model.name,
            max_batch_size=config.max_batch_size,
            inputs=inputs,
            outputs=outputs,
            max_queue_delay_us=round(config.max_batch_delay_ms * 1000),
            max_queue_size=config.max_queue,
            timeout_us=round((config.timeout_s or 0) * 1_000_000),
            instance_kind="KIND_GPU" if device.type == "cuda" else "KIND_CPU",
            instance_count=max(1, config.threads),
            gpus=[device.index or 0] if device.type == "cuda" else [],
            default_model_filename=model.weights,
            parameters=parameters,
        )

    def model_statistics(self, name: str | None, version: str | None) -> list[NamedStatistics]:
        """One model's counters (`name`), or those of every ready model (`name` None), by name."""
        if name is None:
            entries = [e for e in self.fleet.entries() if e.status is Status.ready and e.executor is not None]
            return [
                NamedStatistics(e.spec.name, VERSIONS[0], e.executor.statistics.snapshot())
                for e in sorted(entries, key=lambda e: e.spec.name)
                if e.executor is not None
            ]
        check_version(name, version)
        served = self.ready(name)
        return [NamedStatistics(name, VERSIONS[0], served.executor.statistics.snapshot())]


def _tensor(info: TensorInfo, image: bool) -> ConfigTensor:
    dims = info.shape[1:] if info.shape and info.shape[0] == -1 else info.shape
    return ConfigTensor(info.name, str(info.datatype), list(dims), IMAGE_FORMAT if image else "FORMAT_NONE")
