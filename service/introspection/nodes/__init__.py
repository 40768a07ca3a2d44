"""Functional nodes (FX): tracing a model once, listing its nodes, and forwards that read or replace them."""

from __future__ import annotations

from service.introspection.nodes.graph import (
    NodeGraph,
    NodeInfo,
    OnNode,
    capture_nodes,
    node_bytes,
    resolve_nodes,
    run_nodes,
)
from service.introspection.nodes.trace import Untraceable, trace_nodes

__all__ = [
    "NodeGraph",
    "NodeInfo",
    "OnNode",
    "Untraceable",
    "capture_nodes",
    "node_bytes",
    "resolve_nodes",
    "run_nodes",
    "trace_nodes",
]
