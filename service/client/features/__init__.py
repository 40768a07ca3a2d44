"""Bulk feature extraction over HTTP: a data set's layer features into sharded safetensors files.

    from service.client.features import extract_features, read_features

    report = extract_features("http://127.0.0.1:8000", ["digits/"], "features/", "lenet", ["fc1"], capture="input")
    names, x = read_features("features/")      # x: [rows, 400], names[i] is the file of row i

`hookserve features` is the command-line form, with a progress bar. Runs resume: rerun the
same call and only the shards not yet written are computed.
"""

from __future__ import annotations

from service.client.features.extract import (
    ExtractionMismatch,
    ExtractionReport,
    FeatureRequest,
    Progress,
    extract_features,
    extract_features_async,
)
from service.client.features.sources import list_images
from service.client.features.store import FeatureIndex, Shard, read_features

__all__ = [
    "ExtractionMismatch",
    "ExtractionReport",
    "FeatureIndex",
    "FeatureRequest",
    "Progress",
    "Shard",
    "extract_features",
    "extract_features_async",
    "list_images",
    "read_features",
]
