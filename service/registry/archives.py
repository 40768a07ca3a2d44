"""TorchServe model archives (`.mar`, made by `torch-model-archiver`) as hookserve model specs, read safely.

A `.mar` is a zip: `MAR-INF/MANIFEST.json` names the model (`modelName`, `modelVersion`), its
serialized file (a state dict, or a TorchScript program), its model file (eager mode: a Python file
defining one `nn.Module` class) and its handler; extra files sit beside them (`index_to_name.json`,
the labels). hookserve serves two kinds, both with TorchServe's stock `image_classifier` handler:

- eager: the model file's one class (found by reading the file, not running it), the state dict
  loaded into it with `weights_only=True`; the model file runs when the model is built, as a
  `python` source file does (so registering one needs the admin token, like POST /models);
- TorchScript (no model file): the serialized file loaded with `torch.jit.load`.

A custom handler is Python that hookserve would have to run to answer as it does: such an archive
is refused, with the reason. Reading is bounded before anything is extracted: the archive's size on
disk and its members' total size (`max_upload_bytes`), their count, and every name (no absolute
paths, no `..`, no links, nothing outside the archive's own directory); only regular files are
written, into a fresh private directory, and each is checked against its declared size as it is.
"""

from __future__ import annotations

import ast
import json
import shutil
import stat
import tempfile
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from service.errors import BadInput, InvalidField, TooLarge
from service.specs.model import ModelSpec

MANIFEST = "MAR-INF/MANIFEST.json"
LABELS_JSON = "index_to_name.json"
LABELS_TEXT = "index_to_name.txt"  # written beside the extracted files: one label per line
STOCK_HANDLERS = ("image_classifier",)
OTHER_STOCK_HANDLERS = ("image_segmenter", "object_detector", "text_classifier", "base_handler")
MAX_MEMBERS = 10_000
MAX_MANIFEST_BYTES = 1024 * 1024
MAX_MODEL_FILE_BYTES = 16 * 1024 * 1024
CHUNK = 1024 * 1024


@dataclass(frozen=True)
class Archive:
    """What an archive holds, once checked and extracted into `root`."""

    name: str
    version: str
    handler: str
    kind: str  # "eager" | "torchscript"
    serialized_file: str
    model_file: str | None
    class_name: str | None
    labels: str | None  # LABELS_TEXT under root, when the archive had index_to_name.json
    root: Path
    manifest: dict[str, Any] = field(default_factory=dict)

    def spec(self, name: str, **overrides: Any) -> ModelSpec:
        """The model spec serving this archive (paths relative to `root`): TorchServe's image classifier's
        preprocessing (resize 256, center crop 224, ImageNet mean and std) is hookserve's default."""
        fields: dict[str, Any] = {"name": name, "input_size": [3, 224, 224], "labels": self.labels}
        if self.kind == "eager":
            fields |= {"source": "python", "architecture": f"{self.model_file}:{self.class_name}"}
            fields["weights"] = self.serialized_file
        else:
            fields |= {"source": "torchscript", "architecture": self.serialized_file}
        return ModelSpec.model_validate(fields | {k: v for k, v in overrides.items() if v is not None})


def open_archive(path: Path, max_bytes: int) -> Archive:
    """Check and extract the archive at `path` into a new private directory (removed again if anything fails)."""
    size = path.stat().st_size
    if size > max_bytes:
        raise TooLarge(f"archive {path.name} is {size} bytes, over the {max_bytes}-byte limit (max_upload_bytes)")
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError):
        raise BadInput(
            f"{path.name} is not a model archive (a zip made by torch-model-archiver's default format); "
            "tgz and no-archive formats are not read"
        ) from None
    root = Path(tempfile.mkdtemp(prefix="hookserve-mar-"))
    try:
        with archive:
            members = _checked_members(archive, path.name, max_bytes)
            manifest = _manifest(archive, members, path.name)
            for name, info in members.items():
                _extract(archive, info, root / name)
        return _describe(manifest, members, root, path.name)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise


def _checked_members(archive: zipfile.ZipFile, where: str, max_bytes: int) -> dict[str, zipfile.ZipInfo]:
    infos = archive.infolist()
    if len(infos) > MAX_MEMBERS:
        raise TooLarge(f"{where} holds {len(infos)} entries, over the limit of {MAX_MEMBERS}")
    members: dict[str, zipfile.ZipInfo] = {}
    total = 0
    for info in infos:
        name = info.filename
        if info.is_dir():
            continue
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise BadInput(f"{where}: entry {name!r} is a symbolic link; archives may hold only regular files")
        path = PurePosixPath(name)
        if "\\" in name or "\x00" in name or path.is_absolute() or ".." in path.parts or not path.parts:
            raise BadInput(f"{where}: entry {name!r} would be written outside the archive's directory")
        if name in members:
            raise BadInput(f"{where}: entry {name!r} appears twice")
        total += info.file_size
        if total > max_bytes:
            raise TooLarge(f"{where} unpacks to over {max_bytes} bytes (max_upload_bytes)")
        members[str(path)] = info
    return members


def _manifest(archive: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo], where: str) -> dict[str, Any]:
    info = members.get(MANIFEST)
    if info is None:
        raise BadInput(f"{where} has no {MANIFEST}: it was not made by torch-model-archiver")
    if info.file_size > MAX_MANIFEST_BYTES:
        raise TooLarge(f"{where}: {MANIFEST} is over {MAX_MANIFEST_BYTES} bytes")
    try:
        manifest = json.loads(archive.read(info))
    except (ValueError, UnicodeDecodeError):
        raise BadInput(f"{where}: {MANIFEST} is not valid JSON") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("model"), dict):
        raise BadInput(f'{where}: {MANIFEST} has no "model" object')
    return manifest


def _extract(archive: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path) -> None:
    """Write one member, never more bytes than its directory entry declares (a lying entry is refused)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    try:
        with archive.open(info) as source, target.open("xb") as out:
            while chunk := source.read(CHUNK):
                written += len(chunk)
                if written > info.file_size:
                    raise BadInput(f"entry {info.filename!r} holds more bytes than the archive declares")
                out.write(chunk)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as exc:
        raise BadInput(f"entry {info.filename!r} cannot be read: {exc}") from None


def _describe(manifest: dict[str, Any], members: dict[str, zipfile.ZipInfo], root: Path, where: str) -> Archive:
    model = manifest["model"]
    name = _text(model, "modelName", where)
    handler = _text(model, "handler", where)
    serialized = _text(model, "serializedFile", where, required=False)
    model_file = _text(model, "modelFile", where, required=False) or None
    if handler not in STOCK_HANDLERS:
        if handler in OTHER_STOCK_HANDLERS:
            raise InvalidField(
                f"{where}: handler {handler!r} is not served; hookserve answers as TorchServe's "
                f"{', '.join(STOCK_HANDLERS)} handler does"
            )
        raise InvalidField(
            f"{where}: handler {handler!r} is custom Python code, and hookserve does not run TorchServe handlers. "
            "Archive the model again with --handler image_classifier, or serve its module as a python source "
            '(POST /models with source = "python", the model file under the model dir, the admin token)'
        )
    if not serialized or serialized not in members:
        raise InvalidField(f"{where}: the manifest's serializedFile {serialized!r} is not in the archive")
    class_name = None
    if model_file is not None:
        if model_file not in members or not model_file.endswith(".py"):
            raise InvalidField(f"{where}: the manifest's modelFile {model_file!r} is not a .py file in the archive")
        class_name = _model_class(root / model_file, where)
    labels = _labels(root, members, where)
    return Archive(
        name=name,
        version=str(model.get("modelVersion") or "1.0"),
        handler=handler,
        kind="eager" if model_file else "torchscript",
        serialized_file=serialized,
        model_file=model_file,
        class_name=class_name,
        labels=labels,
        root=root,
        manifest=manifest,
    )


def _text(model: dict[str, Any], key: str, where: str, required: bool = True) -> str:
    value = model.get(key, "")
    if not isinstance(value, str) or (required and not value):
        raise BadInput(f"{where}: the manifest's model.{key} must be a non-empty string")
    return value


def _model_class(path: Path, where: str) -> str:
    """The one class the model file defines, read from its syntax (as TorchServe's loader expects one)."""
    if path.stat().st_size > MAX_MODEL_FILE_BYTES:
        raise TooLarge(f"{where}: model file {path.name} is over {MAX_MODEL_FILE_BYTES} bytes")
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), path.name)
    except (SyntaxError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidField(f"{where}: model file {path.name} is not valid Python: {exc}") from None
    classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    if len(classes) != 1:
        raise InvalidField(
            f"{where}: model file {path.name} defines {len(classes)} classes ({', '.join(classes) or 'none'}); "
            "TorchServe's eager mode expects exactly one nn.Module class"
        )
    return classes[0]


def _labels(root: Path, members: dict[str, zipfile.ZipInfo], where: str) -> str | None:
    """`index_to_name.json` (`{"0": "tench"}` or `{"0": ["n01440764", "tench"]}`) as one label per line."""
    if LABELS_JSON not in members:
        return None
    try:
        mapping = json.loads((root / LABELS_JSON).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise InvalidField(f"{where}: {LABELS_JSON} is not valid JSON") from None
    if not isinstance(mapping, dict) or not mapping:
        raise InvalidField(f"{where}: {LABELS_JSON} must map class indices to names")
    labels: dict[int, str] = {}
    for key, value in mapping.items():
        name = value[-1] if isinstance(value, list) and value else value
        if not str(key).isdigit() or not isinstance(name, str):
            raise InvalidField(f"{where}: {LABELS_JSON} entry {key!r} is not an index with a name")
        labels[int(key)] = " ".join(name.split())  # one line each
    if sorted(labels) != list(range(len(labels))):
        raise InvalidField(f"{where}: {LABELS_JSON} must name every class from 0 to {len(labels) - 1}")
    (root / LABELS_TEXT).write_text("".join(f"{labels[i]}\n" for i in range(len(labels))), encoding="utf-8")
    return LABELS_TEXT
