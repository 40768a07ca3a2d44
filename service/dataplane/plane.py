"""The data plane: one protocol-independent façade over the served models.

Routes (REST and /v2 alike) decode a request, make one call here, and encode what it
returns; everything between (looking up the ready model, decoding inputs off the event
loop, limits that need the model, the job on the model's executor) happens here.
"""

from __future__ import annotations

from service.dataplane.attention import AttentionMaps
from service.dataplane.attribution import Attribution
from service.dataplane.catalogue import Catalogue
from service.dataplane.checkpoints import Checkpoints
from service.dataplane.inference import Inference
from service.dataplane.inspection import Inspection
from service.dataplane.interventions import Experiments
from service.dataplane.nodes import Nodes
from service.dataplane.oip import OpenInference
from service.dataplane.repository import Repository
from service.dataplane.torchserve import TorchServeApi
from service.dataplane.triton_extensions import TritonExtensions


class DataPlane(
    TorchServeApi,
    Inference,
    Inspection,
    Nodes,
    Attribution,
    AttentionMaps,
    Experiments,
    Catalogue,
    Checkpoints,
    OpenInference,
    Repository,
    TritonExtensions,
):
    """Every operation of the service, each taking a validated request and returning a typed result."""
