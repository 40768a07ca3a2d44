"""The package graph runs one way: each layer imports only layers below it (DESIGN.md, service/README.md).

Every `import` of a `service` module, at the top of a file or inside a function, is an edge;
an edge from a layer to a higher one fails, naming the file and line.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SERVICE = Path(__file__).resolve().parents[2] / "service"

# Lowest first. A module belongs to the longest prefix listed; a module may import its own
# layer and every layer below it.
LAYERS: list[tuple[str, ...]] = [
    ("service.client",),  # the HTTP client: below everything, so it can import nothing of the server
    ("service", "service.errors", "service.config", "service.specs", "service.openmp_env"),  # the leaf
    ("service.schemas", "service.dtypes"),  # request/response models (no torch); the dtype table
    ("service.introspection", "service.zoo"),  # pure torch functions on modules; models we ship
    ("service.registry",),  # the catalogue: specs -> loaded models
    ("service.runtime",),  # executors, the fleet, jobs on models
    ("service.codecs",),  # wire formats
    ("service.dataplane",),  # the façade
    ("service.jobs",),  # data-set jobs: chunks of hooked batches on the data plane, persisted
    ("service.api", "service.grpc", "service.torchserve"),  # the protocol fronts: HTTP, gRPC, TorchServe's APIs
    ("service.main", "service.fronts"),  # the app, and the fronts it serves beside HTTP
    # entry points: the server, the command line and its start-up checks, retraining the LeNet and the ViT, the cluster
    (
        "service.__main__",
        "service.zoo.train_lenet",
        "service.zoo.train_vit",
        "service.cli",
        "service.config_check",
        "service.cluster",
    ),
]
RANK = {prefix: rank for rank, prefixes in enumerate(LAYERS) for prefix in prefixes}


def layer_of(module: str) -> str:
    parts = module.split(".")
    for size in range(len(parts), 0, -1):
        prefix = ".".join(parts[:size])
        if prefix in RANK:
            return prefix
    raise AssertionError(f"{module} belongs to no layer; add it to LAYERS")


def module_name(path: Path) -> str:
    relative = path.relative_to(SERVICE.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, int]]:
    """(imported service module, line) for every import in the file, relative ones resolved."""
    found = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names if alias.name.startswith("service")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base == "service" or base.startswith("service."):
                found.append((base, node.lineno))
    return found


def edges() -> list[tuple[str, str, str, int]]:
    """(importer layer, imported layer, file, line) for every import between service modules."""
    out = []
    for path in sorted(SERVICE.rglob("*.py")):
        module = module_name(path)
        tree = ast.parse(path.read_text(), str(path))
        for target, line in imported(tree, module, path.name == "__init__.py"):
            out.append((layer_of(module), layer_of(target), str(path.relative_to(SERVICE.parent)), line))
    return out


def test_no_import_runs_up_the_layers() -> None:
    upward = [f"{file}:{line}: {src} imports {dst}" for src, dst, file, line in edges() if RANK[dst] > RANK[src]]
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)


def test_every_module_belongs_to_a_layer() -> None:
    for path in SERVICE.rglob("*.py"):
        layer_of(module_name(path))


def test_the_graph_is_checked_at_all() -> None:
    """The walk sees real edges in both directions it allows (a layer's own and downward ones)."""
    pairs = {(src, dst) for src, dst, _, _ in edges()}
    assert ("service.api", "service.dataplane") in pairs
    assert ("service.dataplane", "service.runtime") in pairs
    assert ("service.runtime", "service.runtime") in pairs


@pytest.mark.parametrize("module", ["service.specs.model", "service.specs.vocab", "service.schemas.attribution"])
def test_the_leaf_and_the_schemas_load_no_torch(module: str) -> None:
    code = f"import sys, {module}; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
