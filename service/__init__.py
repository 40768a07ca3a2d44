"""hookserve: an HTTP service for PyTorch models, inference and introspection in one place."""

from __future__ import annotations

__version__ = "0.1.0"
