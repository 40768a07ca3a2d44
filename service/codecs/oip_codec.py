"""How a protocol front hands an inference request to the data plane, and gets its answer back encoded.

The data plane runs every Open Inference Protocol request the same way (the model ready, the
request decoded off the event loop, its memory admitted, the batch run, the answer encoded); a
front only says how its request arrives and how its answer is written, as an `InferCodec`:
`HttpInfer` for REST (JSON with the binary tensor extension), `GrpcInfer`
(`service.codecs.oip_grpc`) for gRPC.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch

from service.codecs.oip_infer import DecodedInfer, decode_body, encode_infer
from service.config import Settings
from service.registry.loaded import LoadedModel

T_co = TypeVar("T_co", covariant=True)


class InferCodec(Protocol[T_co]):
    async def receive(self) -> None:
        """Take what the request still has to deliver (an HTTP body); called once the model is known ready."""

    def decode(self, model: LoadedModel, settings: Settings) -> DecodedInfer:
        """The request as the model's batch and the outputs asked for (runs off the event loop)."""

    def encode(
        self, model: LoadedModel, decoded: DecodedInfer, tensors: Mapping[str, torch.Tensor], settings: Settings
    ) -> T_co:
        """The answer in the front's wire format (runs off the event loop when large)."""


@dataclass(frozen=True)
class HttpAnswer:
    body: bytes
    header_length: int | None  # the JSON header's length when binary outputs follow it


class HttpInfer:
    """REST: the body is JSON, or a JSON header and raw tensor bytes (maybe gzip/deflate compressed)."""

    def __init__(self, body: Callable[[], Awaitable[bytes]], encoding: str | None, header_length: str | None) -> None:
        self._read = body
        self._raw = b""
        self._encoding = encoding
        self._header_length = header_length

    async def receive(self) -> None:
        self._raw = await self._read()

    def decode(self, model: LoadedModel, settings: Settings) -> DecodedInfer:
        return decode_body(self._raw, self._encoding, self._header_length, model, settings)

    def encode(
        self, model: LoadedModel, decoded: DecodedInfer, tensors: Mapping[str, torch.Tensor], settings: Settings
    ) -> HttpAnswer:
        return HttpAnswer(*encode_infer(model, decoded, tensors, settings))
