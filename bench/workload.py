"""What the benchmark sends: the input files, one prebuilt request per kind, and each kind's raw counterpart."""

from __future__ import annotations

import io
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from PIL import Image

from bench.payloads import Payload, b64, json_payload, multipart_payload
from bench.raw_torch import RESNET_SPEC
from service.codecs.preprocess import preprocess_image

ONE_LAYER = "layer1.0.conv1"  # output [1, 64, 56, 56] for a 224x224 input
LAST_STAGE = "layer4"  # issue 12's one layer: output [1, 512, 7, 7], reduced to [1, 512]
LENET_SAMPLE = Path(__file__).resolve().parent.parent / "service" / "zoo" / "samples" / "digit_3.png"
JPEG = "image/jpeg"


class Kind(StrEnum):
    """Every kind of request the benchmark measures."""

    PREDICT_JPEG_MULTIPART = "predict-jpeg-multipart"
    PREDICT_JPEG_B64 = "predict-jpeg-b64"
    PREDICT_TENSOR = "predict-tensor"
    ACTIVATIONS_ALLCONV_ST = "activations-allconv-st"
    ACTIVATIONS_1LAYER_JSON = "activations-1layer-json"
    ACTIVATIONS_1LAYER_ST = "activations-1layer-st"
    SALIENCY_GRADCAM = "saliency-gradcam"
    SALIENCY_IG = "saliency-ig32"
    LENET_PREDICT = "lenet-predict"
    ACTIVATIONS_L4_JPEG = "activations-layer4-mean-jpeg"
    ACTIVATIONS_ALLCONV_ST_JPEG = "activations-allconv-st-jpeg"
    GRADIENTS_L4_JPEG = "gradients-layer4-jpeg"
    SALIENCY_GRADCAM_JPEG = "saliency-gradcam-jpeg"
    VIT_PREDICT_JPEG = "vit-predict-jpeg"
    VIT_ATTENTION_JPEG = "vit-attention-1block-jpeg"


LABELS: dict[Kind, str] = {
    Kind.PREDICT_JPEG_MULTIPART: "resnet18 /predict, JPEG multipart upload",
    Kind.PREDICT_JPEG_B64: "resnet18 /predict, JPEG base64 in JSON",
    Kind.PREDICT_TENSOR: "resnet18 /predict, base64 float32 tensor in JSON",
    Kind.ACTIVATIONS_ALLCONV_ST: "resnet18 /activations, every Conv2d output, safetensors (tensor input)",
    Kind.ACTIVATIONS_1LAYER_JSON: f"resnet18 /activations, {ONE_LAYER} [1,64,56,56], JSON (tensor input)",
    Kind.ACTIVATIONS_1LAYER_ST: f"resnet18 /activations, {ONE_LAYER} [1,64,56,56], safetensors (tensor input)",
    Kind.SALIENCY_GRADCAM: "resnet18 /saliency gradcam, JSON (tensor input)",
    Kind.SALIENCY_IG: "resnet18 /saliency integrated_gradients steps=32, JSON (tensor input)",
    Kind.LENET_PREDICT: "lenet /predict, 8x8 PNG multipart upload",
    Kind.ACTIVATIONS_L4_JPEG: f"resnet18 /activations, {LAST_STAGE} reduce=mean, JSON (JPEG multipart upload)",
    Kind.ACTIVATIONS_ALLCONV_ST_JPEG: "resnet18 /activations, every Conv2d output, safetensors (JPEG multipart upload)",
    Kind.GRADIENTS_L4_JPEG: f"resnet18 /gradients, {LAST_STAGE}, top-1, include_input=false, JSON (JPEG upload)",
    Kind.SALIENCY_GRADCAM_JPEG: "resnet18 /saliency gradcam, JSON (JPEG multipart upload)",
    Kind.VIT_PREDICT_JPEG: "vit_tiny /predict, JPEG multipart upload",
    Kind.VIT_ATTENTION_JPEG: "vit_tiny /attention of blocks.11 (the class token's row, every head), JSON (JPEG upload)",
}
PREDICT_KINDS = (Kind.PREDICT_JPEG_MULTIPART, Kind.PREDICT_JPEG_B64, Kind.PREDICT_TENSOR)
INTROSPECTION_KINDS = (
    Kind.ACTIVATIONS_ALLCONV_ST,
    Kind.ACTIVATIONS_1LAYER_JSON,
    Kind.ACTIVATIONS_1LAYER_ST,
    Kind.SALIENCY_GRADCAM,
    Kind.SALIENCY_IG,
)
JPEG_INTROSPECTION_KINDS = (  # issue 12: hooked requests under load, with the upload a user sends
    Kind.ACTIVATIONS_L4_JPEG,
    Kind.ACTIVATIONS_ALLCONV_ST_JPEG,
    Kind.GRADIENTS_L4_JPEG,
    Kind.SALIENCY_GRADCAM_JPEG,
)


@dataclass(frozen=True)
class Inputs:
    jpeg: bytes
    tensor_b64: str
    png: bytes

    def describe(self) -> str:
        return (
            f"skimage.data.chelsea() 451x300 saved as JPEG quality 90 ({len(self.jpeg)} bytes); tensor input = that "
            "image after resnet18's preprocessing, [3,224,224] float32, base64 in JSON; lenet input = "
            f"service/zoo/samples/{LENET_SAMPLE.name} ({len(self.png)} bytes)"
        )


def make_jpeg(quality: int = 90) -> bytes:
    """skimage's chelsea (a 451x300 photo that ships with scikit-image) as a JPEG; no download."""
    from skimage import data

    out = io.BytesIO()
    pixels = data.chelsea()
    Image.fromarray(pixels).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def make_inputs() -> Inputs:
    jpeg = make_jpeg()
    tensor = preprocess_image(Image.open(io.BytesIO(jpeg)), RESNET_SPEC, 3)
    return Inputs(jpeg, b64(tensor.numpy().tobytes()), LENET_SAMPLE.read_bytes())


def build_payloads(inputs: Inputs, conv_layers: list[str], model: str = "resnet18") -> dict[Kind, Payload]:
    """One prebuilt request per kind; `conv_layers` are the model's Conv2d module names (from /layers)."""
    tensor = {"tensor": {"shape": [3, 224, 224], "dtype": "float32", "b64": inputs.tensor_b64}}

    def js(kind: Kind, path: str, items: list[object] | None = None, **extra: object) -> Payload:
        return json_payload(kind.value, path, {"model": model, "inputs": items or [tensor], **extra})

    def upload(kind: Kind, path: str, **fields: str) -> Payload:
        """The cat JPEG as a multipart upload with form fields, as `curl -F k=v -F image=@cat.jpg` sends it."""
        return multipart_payload(kind.value, path, {"model": model, **fields}, [("chelsea.jpg", inputs.jpeg, JPEG)])

    return {
        Kind.PREDICT_JPEG_MULTIPART: multipart_payload(
            Kind.PREDICT_JPEG_MULTIPART.value,
            "/predict",
            {"model": model},
            [("chelsea.jpg", inputs.jpeg, "image/jpeg")],
        ),
        Kind.PREDICT_JPEG_B64: js(Kind.PREDICT_JPEG_B64, "/predict", [{"image": b64(inputs.jpeg)}]),
        Kind.PREDICT_TENSOR: js(Kind.PREDICT_TENSOR, "/predict"),
        Kind.ACTIVATIONS_ALLCONV_ST: js(
            Kind.ACTIVATIONS_ALLCONV_ST, "/activations", layers=conv_layers, format="safetensors"
        ),
        Kind.ACTIVATIONS_1LAYER_JSON: js(
            Kind.ACTIVATIONS_1LAYER_JSON, "/activations", layers=[ONE_LAYER], format="json"
        ),
        Kind.ACTIVATIONS_1LAYER_ST: js(
            Kind.ACTIVATIONS_1LAYER_ST, "/activations", layers=[ONE_LAYER], format="safetensors"
        ),
        Kind.SALIENCY_GRADCAM: js(Kind.SALIENCY_GRADCAM, "/saliency", method="gradcam"),
        Kind.SALIENCY_IG: js(Kind.SALIENCY_IG, "/saliency", method="integrated_gradients", steps=32),
        Kind.LENET_PREDICT: multipart_payload(
            Kind.LENET_PREDICT.value, "/predict", {"model": "lenet"}, [(LENET_SAMPLE.name, inputs.png, "image/png")]
        ),
        Kind.ACTIVATIONS_L4_JPEG: upload(
            Kind.ACTIVATIONS_L4_JPEG, "/activations", layers=LAST_STAGE, reduce="mean", format="json"
        ),
        Kind.ACTIVATIONS_ALLCONV_ST_JPEG: upload(
            Kind.ACTIVATIONS_ALLCONV_ST_JPEG, "/activations", layers=",".join(conv_layers), format="safetensors"
        ),
        Kind.GRADIENTS_L4_JPEG: upload(
            Kind.GRADIENTS_L4_JPEG, "/gradients", layers=LAST_STAGE, include_input="false", format="json"
        ),
        Kind.SALIENCY_GRADCAM_JPEG: upload(Kind.SALIENCY_GRADCAM_JPEG, "/saliency", method="gradcam", format="json"),
    }


def baseline(kind: Kind, clients: int, torch_threads: int) -> str:
    """The raw-torch row a hookserve point is divided by (see bench.run.RAW_ROWS for the keys)."""
    threads = 2 if torch_threads >= 2 else 1
    if kind is Kind.LENET_PREDICT:
        return "lenet-forward-b1-t1"
    if kind in (Kind.PREDICT_JPEG_MULTIPART, Kind.PREDICT_JPEG_B64, *JPEG_INTROSPECTION_KINDS):
        return "e2e-b8-t2" if clients > 1 else f"e2e-b1-t{threads}"
    return "forward-b8-t2" if clients > 1 else f"forward-b1-t{threads}"
