"""Start-up validation: the settings and the models TOML, one readable line per problem, before anything loads.

A typo in the TOML used to surface as a uvicorn lifespan traceback ending in a pydantic
error list; a missing weights file or an absent GPU only as a failed model once the server
was up. `check(flags)` finds all of these up front and names, per problem, the file, the
model entry and the field, with the closest valid value when there is one:

    models.toml: models[0] (x).source: 'torvision' is not one of torchvision, timm, python, torchscript; did you
    mean 'torchvision'?

`python -m service` (and `hookserve serve`) exit with status 2 after printing them;
`hookserve check` runs the same checks and loads nothing. Libraries are imported only
when an entry needs them (torchvision's and timm's model lists, torch for devices and
optimizers), so a config of plain Python models is checked without importing torch.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import sys
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from pydantic import BaseModel, ValidationError

from service.config import Settings
from service.errors import HookserveError
from service.registry.paths import resolve_under
from service.specs.model import ModelSpec, Source

EXIT_INVALID = 2
DEVICE_PATTERN = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
DEVICES = ("auto", "cpu", "cuda", "cuda:0", "mps")
MAX_LISTED_FILES = 5000  # files under the model dir considered for "did you mean"
DEFAULT_WEIGHTS = "DEFAULT"
LABEL_SUFFIXES = (".txt", ".json", ".csv", ".tsv", ".names")  # what a labels file is; weights never are
PLAIN_TYPES = {
    "int_parsing": "an integer",
    "int_type": "an integer",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a table",
}


@dataclass(frozen=True)
class Problem:
    """One thing wrong: where (file, entry and field, or a flag / env name) and what."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass(frozen=True)
class CheckResult:
    """The merged settings (None when they could not be built), the models found, and every problem."""

    settings: Settings | None
    models: list[str]
    problems: list[Problem]


def closest(value: object, choices: Iterable[str]) -> str | None:
    """The most similar choice (difflib ratio >= 0.5), or None."""
    found = difflib.get_close_matches(str(value), list(choices), n=1, cutoff=0.5)
    return found[0] if found else None


def _did_you_mean(value: object, choices: Iterable[str]) -> str:
    match = closest(value, choices)
    return f"; did you mean {match!r}?" if match is not None else ""


# ---- settings (flags and HOOKSERVE_* environment) --------------------------------------------


def _setting_name(field: str, flags: Mapping[str, Any]) -> str:
    """How the person set it: the flag when given (flags win), else the environment variable."""
    return f"--{field.replace('_', '-')}" if field in flags else f"HOOKSERVE_{field.upper()}"


def build_settings(flags: Mapping[str, Any]) -> tuple[Settings | None, list[Problem]]:
    """`Settings(**flags)` (flags win over the environment), or the problems that prevented it."""
    try:
        settings = Settings(**flags)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            field = str(err["loc"][0]) if err["loc"] else "settings"
            problems.append(Problem(_setting_name(field, flags), _pydantic_message(err, [])))
        return None, problems
    problems = []
    if not 1 <= settings.port <= 65535:
        problems.append(Problem(_setting_name("port", flags), f"{settings.port} is not a port (1 to 65535)"))
    device = device_problem(settings.device)
    if device is not None:
        problems.append(Problem(_setting_name("device", flags), device))
    return settings, problems


def device_problem(device: str) -> str | None:
    """Why `device` cannot be used on this machine, or None. Imports torch only for cuda and mps."""
    if not DEVICE_PATTERN.match(device):
        return f"{device!r} is not a device; use auto, cpu, cuda, cuda:N or mps{_did_you_mean(device, DEVICES)}"
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return f"{device!r} is not there: CUDA is not available on this machine; use auto or cpu"
        index = int(device.partition(":")[2] or 0)
        count = torch.cuda.device_count()
        if index >= count:
            return f"{device!r} is not there: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
    elif device == "mps":
        import torch

        if not torch.backends.mps.is_available():
            return "'mps' is not there: MPS is not available on this machine; use auto or cpu"
    return None


# ---- pydantic errors as sentences -------------------------------------------------------------


def _path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _fields_at(model: type[BaseModel], loc: Sequence[int | str]) -> list[str]:
    """The field names of the (nested) pydantic model that holds the field at `loc`."""
    for part in loc[:-1]:
        if isinstance(part, int) or part not in model.model_fields:
            return []
        nested = _model_in(model.model_fields[part].annotation)
        if nested is None:
            return []
        model = nested
    return list(model.model_fields)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    origin = typing.get_origin(annotation)
    members = typing.get_args(annotation) if origin in (typing.Union, types.UnionType) else (annotation,)
    for member in members:
        if isinstance(member, type) and issubclass(member, BaseModel):
            return member
    return None


def _nested_home(loc: Sequence[int | str]) -> str | None:
    """`models.preprocess` when an entry's unknown field is a field of one of its tables (e.g. `interpolation`)."""
    if len(loc) != 1 or not isinstance(loc[0], str):
        return None
    for name, info in ModelSpec.model_fields.items():
        nested = _model_in(info.annotation)
        if nested is not None and loc[0] in nested.model_fields:
            return f"models.{name}"
    return None


def _pydantic_message(err: Mapping[str, Any], fields: Sequence[str]) -> str:
    kind = err.get("type", "")
    value = err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "missing":
        return "required field missing"
    if kind == "extra_forbidden":
        home = _nested_home(err["loc"])
        if home is not None:
            return f"unknown field here; {err['loc'][-1]!r} belongs under [{home}]"
        hint = _did_you_mean(err["loc"][-1], fields) if fields else ""
        return f"unknown field{hint}" if hint else f"unknown field (valid: {', '.join(fields)})"
    if kind in ("enum", "literal_error"):
        expected = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        return f"{value!r} is not one of {', '.join(expected)}{_did_you_mean(value, expected)}"
    if kind in PLAIN_TYPES:
        return f"{value!r} is not {PLAIN_TYPES[kind]}"
    if kind == "string_pattern_mismatch" and err["loc"][-1] == "name":
        return f"{value!r} is not a URL-safe name (a letter or digit, then letters, digits, '_', '.', '-'; at most 64)"
    message = str(err.get("msg", "")).removeprefix("Value error, ")
    shown = repr(value)
    if isinstance(value, (str, int, float, bool, list)) and len(shown) <= 60:
        return f"{message} (got {shown})"
    return message


# ---- the models TOML ------------------------------------------------------------------------


class _Files:
    """Files under the model dir, listed once, for "did you mean" on a missing path."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._names: list[str] | None = None

    def names(self, suffixes: tuple[str, ...] = ()) -> list[str]:
        if self._names is None:
            found: list[str] = []
            for dirpath, dirnames, filenames in os.walk(self.root):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
                base = Path(dirpath).relative_to(self.root)
                found += [(base / f).as_posix() for f in sorted(filenames) if not f.startswith(".")]
                if len(found) >= MAX_LISTED_FILES:
                    break
            self._names = found[:MAX_LISTED_FILES]
        return [n for n in self._names if not suffixes or n.endswith(suffixes)]


def _file_problem(files: _Files | None, relative: str, what: str, suffixes: tuple[str, ...] = ()) -> str | None:
    if files is None:  # the model dir itself is missing; reported once
        return None
    try:
        resolve_under(files.root, relative)
    except HookserveError as exc:
        detail = str(exc.detail)
        if "no file" in detail:
            detail = f"no {what} {relative!r} under the model dir {str(files.root)!r}"
            return detail + _did_you_mean(relative, files.names(suffixes))
        return detail
    return None


def _architecture_problem(source: Source, name: str, files: _Files | None) -> str | None:
    """What the source's builder would refuse, checked without building (a source not named here: nothing)."""
    if source is Source.torchvision:
        import torchvision

        known = torchvision.models.list_models()
        if name not in known:
            return f"torchvision has no model {name!r}{_did_you_mean(name, known)}"
        return None
    if source is Source.timm:
        import timm

        if not timm.is_model(name):
            return f"timm has no model {name!r}{_did_you_mean(name, timm.list_models())}"
        return None
    if source is Source.torchscript:
        return _file_problem(files, name, "TorchScript file")
    if source is not Source.python:
        return None
    location, sep, class_name = name.rpartition(":")
    if not sep or not location or not class_name:
        return f"{name!r} must be 'pkg.module:ClassName' or 'file.py:ClassName' (a file under the model dir)"
    if location.endswith(".py"):
        return _file_problem(files, location, "file", (".py",))
    top = location.split(".")[0]
    if importlib.util.find_spec(top) is None:
        return f"no module {top!r} can be imported (from {name!r})"
    return None


def _optimizer_problem(name: str) -> str | None:
    import torch

    names = [n for n, c in vars(torch.optim).items() if isinstance(c, type) and issubclass(c, torch.optim.Optimizer)]
    if name not in names or name == "Optimizer":
        return f"torch.optim has no optimizer {name!r}{_did_you_mean(name, names)}"
    return None


def _text(item: Mapping[str, Any], key: str) -> str | None:
    value = item.get(key)
    return value if isinstance(value, str) else None


def _entry_problems(item: Mapping[str, Any], settings: Settings, files: _Files | None) -> list[tuple[str, str]]:
    """(field, message) for what the schema cannot see: files, libraries, devices.

    Read from the raw entry, so that an entry with a schema error still gets these checks.
    """
    source = Source(item["source"]) if item.get("source") in tuple(Source) else None
    weights, labels, architecture, device = (_text(item, k) for k in ("weights", "labels", "architecture", "device"))
    optimizer = item.get("optimizer")
    optimizer_type = optimizer.get("type", "SGD") if isinstance(optimizer, dict) else None
    found: list[tuple[str, str | None]] = []
    if weights == DEFAULT_WEIGHTS:
        if source is Source.python:
            found.append(("weights", "'DEFAULT' (a library's pretrained weights) is for torchvision and timm models"))
        elif not settings.allow_downloads:
            found.append(
                (
                    "weights",
                    "'DEFAULT' needs downloads, which are disabled; set HOOKSERVE_ALLOW_DOWNLOADS=true "
                    "or point weights at a file under the model dir",
                )
            )
    elif weights is not None:
        found.append(("weights", _file_problem(files, weights, "weights file")))
    if labels is not None:
        found.append(("labels", _file_problem(files, labels, "labels file", LABEL_SUFFIXES)))
    if source is not None and architecture:
        found.append(("architecture", _architecture_problem(source, architecture, files)))
    if isinstance(optimizer_type, str):
        found.append(("optimizer.type", _optimizer_problem(optimizer_type)))
    if device is not None:
        found.append(("device", device_problem(device)))
    return [(field, message) for field, message in found if message is not None]


def _needs_model_dir(item: Mapping[str, Any]) -> bool:
    weights, labels, architecture = (_text(item, k) for k in ("weights", "labels", "architecture"))
    local_code = item.get("source") == Source.python and (architecture or "").partition(":")[0].endswith(".py")
    return weights not in (None, DEFAULT_WEIGHTS) or labels is not None or local_code


def check_models(path: Path, settings: Settings, rehearse: bool = False) -> tuple[list[str], list[Problem]]:
    """Every problem of the models TOML at `path`, and the names of its models. `rehearse`: also build each sound
    entry on the meta device (`service.registry.dry_build`), and call a file without entries a problem."""
    where = str(path)
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        return [], [Problem(where, "no such file (--config / HOOKSERVE_CONFIG)")]
    except OSError as exc:
        return [], [Problem(where, f"cannot read: {exc.strerror or exc}")]
    except tomllib.TOMLDecodeError as exc:
        return [], [Problem(where, f"not valid TOML: {exc}")]
    problems = [
        Problem(
            f"{where}: {key}",
            f"unknown top-level key; the file holds [[models]] entries{_did_you_mean(key, ['models'])}",
        )
        for key in data
        if key != "models"
    ]
    raw = data.get("models", [])
    if not isinstance(raw, list):
        return [], [*problems, Problem(f"{where}: models", "must be an array of tables ([[models]])")]
    if rehearse and not raw and not problems:
        problems.append(Problem(where, "holds no [[models]] entries: the server would serve no model"))
    files = _Files(settings.model_dir) if settings.model_dir.is_dir() else None
    names: list[str] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(raw):
        label = f"models[{i}]"
        if not isinstance(item, dict):
            problems.append(Problem(f"{where}: {label}", "must be a table ([[models]] with name, source, ...)"))
            continue
        name = _text(item, "name")
        if name is not None:
            label += f" ({name})"
            names.append(name)
        found: list[tuple[str, str]] = []  # (field path, message)
        if name is not None and name in seen:
            found.append(("name", f"{name!r} is already the name of models[{seen[name]}]"))
        if name is not None:
            seen.setdefault(name, i)
        schema_fields: set[str] = set()
        spec: ModelSpec | None = None
        try:
            spec = ModelSpec.model_validate(item)
        except ValidationError as exc:
            for err in exc.errors(include_url=False):
                loc = list(err["loc"])
                schema_fields.add(_path(loc[:2]) if loc[:1] == ["optimizer"] else str(loc[0]) if loc else "")
                found.append((_path(loc), _pydantic_message(err, _fields_at(ModelSpec, loc))))
        found += [(f, m) for f, m in _entry_problems(item, settings, files) if f not in schema_fields]
        if rehearse and spec is not None and not found and files is not None:
            found += _rehearsal(spec, settings.model_dir)
        order = list(item)  # the entry's keys as the file has them: report in that order
        found.sort(key=lambda fm: order.index(fm[0].split(".")[0]) if fm[0].split(".")[0] in order else len(order))
        problems += [Problem(f"{where}: {label}.{field}", message) for field, message in found]
    if files is None and any(isinstance(item, dict) and _needs_model_dir(item) for item in raw):
        flag = "--model-dir / HOOKSERVE_MODEL_DIR"
        problems.append(Problem(where, f"the model dir {str(settings.model_dir)!r} ({flag}) is not a directory"))
    return names, problems


def check(flags: Mapping[str, Any], *, thorough: bool = False, startup: bool = False) -> CheckResult:
    """Every problem of the settings (flags over environment) and of the models TOML they name.

    `startup` (the server, before it imports anything heavy) adds what the server itself needs: the host and
    port are bound, and the model dir must exist when a TOML or the dir itself is given. `thorough`
    (`hookserve check`) adds those and what costs more than reading files: each sound model is built on the
    meta device with its kwargs, its weights' keys and shapes matched and a forward run at its input size (the
    built-in models too when no TOML is given); a TOML without models is a problem. The server leaves the
    model builds to loading itself, which reports each model that fails in /models without stopping the others
    (and runs a model's own code once, not twice)."""
    settings, problems = build_settings(flags)
    if settings is None:
        return CheckResult(settings, [], problems)
    server_level = thorough or startup
    if server_level:
        problems += _address_problems(settings, flags)
    if settings.config is None:
        names, more = _builtin_problems() if thorough else ([], [])
    else:
        names, more = check_models(Path(settings.config), settings, rehearse=thorough)
    said = any(p.message.startswith("the model dir") for p in more)
    named = _given("model_dir", flags) or (thorough and settings.config is not None)  # a TOML may need no dir
    if server_level and named and not said and not settings.model_dir.is_dir():
        where = _setting_name("model_dir", flags)
        problems.append(Problem(where, f"{str(settings.model_dir)!r} is not a directory"))
    return CheckResult(settings, names, problems + more)


def _given(field: str, flags: Mapping[str, Any]) -> bool:
    return field in flags or f"HOOKSERVE_{field.upper()}" in os.environ


def _address_problems(settings: Settings, flags: Mapping[str, Any]) -> list[Problem]:
    """Whether the server could listen on host:port now, and on its gRPC and TorchServe-management ports when
    they are on: the host an address of this machine, each port free and no two the same."""
    import errno
    import socket

    host = _setting_name("host", flags)
    ports = {"port": settings.port, "grpc_port": settings.grpc_port}
    ports["torchserve_management_port"] = settings.torchserve_management_port
    wanted = {field: port for field, port in ports.items() if port and 1 <= port <= 65535}  # None: off; 0: any
    problems: list[Problem] = []
    seen: dict[int, str] = {}
    for field, port in wanted.items():
        if port in seen:
            other = _setting_name(seen[port], flags)
            problems.append(Problem(_setting_name(field, flags), f"{port} is also {other}; give each its own port"))
        seen.setdefault(port, field)
    for field, port in wanted.items():
        try:
            family, kind, proto, _, address = socket.getaddrinfo(settings.host, port, type=socket.SOCK_STREAM)[0]
        except socket.gaierror as exc:
            return [Problem(host, f"{settings.host!r} is not a host name or address ({exc.strerror})")]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does (no SO_REUSEPORT: a
            try:  # gRPC server, which sets it, would otherwise share the port with another silently)
                probe.bind(address)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    return [Problem(host, f"cannot listen on {settings.host!r}: {exc.strerror or exc}")]
                where = _setting_name(field, flags)
                problems.append(Problem(where, f"{port} is in use on {settings.host}; choose another port"))
    return problems


def _builtin_problems() -> tuple[list[str], list[Problem]]:
    """The built-in models, rehearsed like a TOML's."""
    from service.registry.builtin import ZOO_DIR, builtin_specs

    specs = builtin_specs()
    problems: list[Problem] = []
    for spec in specs:
        problems += [Problem(f"built-in models: {spec.name}.{f}", m) for f, m in _rehearsal(spec, ZOO_DIR)]
    return [spec.name for spec in specs], problems


def _rehearsal(spec: ModelSpec, model_dir: Path) -> list[tuple[str, str]]:
    from service.registry.dry_build import rehearse  # torch, only for a thorough check

    return rehearse(spec, model_dir)


def settings_or_exit(flags: Mapping[str, Any]) -> Settings:
    """The settings to serve with; with any problem, print one line each to stderr and exit 2."""
    result = check(flags, startup=True)
    if result.problems or result.settings is None:
        for problem in result.problems:
            print(problem, file=sys.stderr)
        exit_invalid()
    return result.settings


def exit_invalid() -> NoReturn:
    raise SystemExit(EXIT_INVALID)
