"""Edits of layer outputs during a forward, from a closed set of ops: data, never code.

An edit names a site (a module, one of its calls), a selection (channels, and y/x ranges of a
spatial output; or, on a vision transformer's token sequence `[N, T, D]`, tokens along dim 1 and
channels along the last dim) and an op: zero, scale, add (a scalar or a tensor: steering), clamp, mean
(over the spatial dims, or over the request's clean inputs), noise (seeded), patch (the same
site of a donor run) or set. A forward hook returns the edited output, so everything downstream
sees it; edits at one site apply in the order given. An edit of attention heads is an edit of the input
of the module where the heads' outputs meet (`side="input"`, a forward-pre hook), on their channels.
`Editor` applies, within one forward over several requests' rows, each request's edits to its own rows
only, and records which edits fired (an edit whose site never ran is the caller's 422); `EditHooks` calls
it from module hooks, and a node graph's interpreter calls it for functional-node sites.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from service.errors import InvalidField
from service.introspection.hooks import HookScope


@dataclass(frozen=True)
class Selection:
    channels: tuple[int, ...] | None = None
    y: tuple[int, int] | None = None
    x: tuple[int, int] | None = None


@dataclass(frozen=True)
class EditOp:
    """One edit as the torch side sees it: where, which part, what, and what it needs."""

    index: int  # its place in the request's list
    site: str
    call: int
    selection: Selection
    op: str  # zero | scale | add | clamp | mean | noise | patch | set
    factor: float = 1.0
    value: float | None = None
    low: float | None = None
    high: float | None = None
    tensor: Tensor | None = None  # add / set
    over: str = "spatial"  # mean
    std: float = 0.0  # noise
    seed: int = 0
    source: str | None = None  # patch
    side: str = "output"  # or "input": the site's (first) argument, for heads where their outputs meet
    token_axis: bool = False  # the site gives tokens [N, T, D]: `tokens` pick dim 1, channels the last dim
    tokens: tuple[int, ...] | None = None  # positions along dim 1 of such a tensor
    token_count: int | None = None  # how many tokens the site gives at the input size `tokens` were chosen for
    heads: tuple[int, ...] | None = None  # the attention heads these channels are (reported)
    attention: str | None = None  # the attention module whose heads are edited (reported as the edit's site)


@dataclass
class Fired:
    """An edit that applied: the site's output shape for one input, and how many of its elements changed."""

    shape: list[int]
    elements: int


Donors = Callable[[str, str, int, str], Tensor]  # (source, site, call, side) -> the donor's rows at that site
Means = Callable[[str, int, str], Tensor]  # (site, call, side) -> the request's clean rows at that site


@dataclass
class RowEdits:
    """One request's edits and the rows of the batch they apply to."""

    start: int
    stop: int
    edits: Sequence[EditOp]
    donors: Donors
    means: Means
    fired: dict[int, Fired] = field(default_factory=dict)


class Editor:
    """Applies, to one site's output in a batched forward, each request's edits for that site on its rows."""

    def __init__(self, requests: Sequence[RowEdits]) -> None:
        self.requests = requests

    def sites(self, side: str | None = None) -> list[str]:
        edits = [edit for request in self.requests for edit in request.edits if side in (None, edit.side)]
        return list(dict.fromkeys(edit.site for edit in edits))

    def edit(self, site: str, call: int, output: Any, side: str = "output") -> Any:
        """The edited output (or input: `side`), a new tensor, or None when no edit is for this site and call."""
        mine = [(r, e) for r in self.requests for e in r.edits if (e.site, e.call, e.side) == (site, call, side)]
        if not mine:
            return None
        if not isinstance(output, Tensor):
            raise InvalidField(f"site {site!r} gives {type(output).__name__}, not one tensor: it cannot be edited")
        out = output.clone()  # never in place: the original may be reused (in-place ReLUs, residual adds)
        for request, op in mine:
            rows = out[request.start : request.stop]
            edited, count = apply_edit(rows, op, request)
            out[request.start : request.stop] = edited
            request.fired[op.index] = Fired(list(rows.shape[1:]), count)
        return out


class EditHooks:
    """Forward hooks on every edited module that apply each request's edits to its rows, in order."""

    def __init__(self, model: nn.Module, requests: Sequence[RowEdits]) -> None:
        self.model = model
        self.editor = Editor(requests)
        self.calls: dict[str, int] = {}

    def register(self, scope: HookScope) -> None:
        modules = dict(self.model.named_modules())
        inputs, outputs = set(self.editor.sites("input")), set(self.editor.sites("output"))
        for site in self.editor.sites():
            if site not in modules:
                raise InvalidField(f"unknown site {site!r} (GET /models/{{name}}/layers lists them)")
            module = modules[site]
            scope.add(module.register_forward_pre_hook(self._counter(site)))
            if site in inputs:
                scope.add(module.register_forward_pre_hook(self._input_editor(site)))
            if site in outputs:
                scope.add(module.register_forward_hook(self._editor(site)))

    def _counter(self, site: str) -> Callable[[nn.Module, Any], None]:
        def count(module: nn.Module, args: Any) -> None:
            self.calls[site] = self.calls.get(site, 0) + 1

        return count

    def _editor(self, site: str) -> Callable[[nn.Module, Any, Any], Any]:
        def edit(module: nn.Module, args: Any, output: Any) -> Any:
            return self.editor.edit(site, self.calls[site], output)

        return edit

    def _input_editor(self, site: str) -> Callable[[nn.Module, Any], Any]:
        def edit(module: nn.Module, args: Any) -> Any:
            if not args:
                raise InvalidField(f"site {site!r} takes no positional tensor to edit")
            edited = self.editor.edit(site, self.calls[site], args[0], side="input")
            return None if edited is None else (edited, *args[1:])

        return edit


def apply_edit(rows: Tensor, op: EditOp, request: RowEdits) -> tuple[Tensor, int]:
    """`rows` with `op` applied to its selection, and how many elements of one row it covers."""
    index = _index(rows, op)
    region = rows[index]
    new = _edited(region, rows, op, request, index)
    out = rows.clone()
    out[index] = new.to(region.dtype)
    per_row = region[0].numel() if region.ndim else 1
    return out, per_row


def _index(rows: Tensor, op: EditOp) -> tuple[Any, ...]:
    """The selection as an index tuple, its bounds checked against the output."""
    if op.token_axis:
        return _token_index(rows, op)
    sel, where = op.selection, f"edit {op.index} at {op.site!r}"
    index: list[Any] = [slice(None)]
    if sel.channels is not None:
        if rows.ndim < 2:
            raise InvalidField(f"{where}: the output {list(rows.shape[1:])} has no channel dimension")
        bad = [c for c in sel.channels if c >= rows.shape[1]]
        if bad:
            raise InvalidField(f"{where}: channels {bad} are out of range: the output has {rows.shape[1]} channels")
        index.append(list(sel.channels))
    for name, span, dim in (("y", sel.y, rows.ndim - 2), ("x", sel.x, rows.ndim - 1)):
        if span is None:
            continue
        if rows.ndim < 4:
            raise InvalidField(f"{where}: {name} needs a spatial output [N, C, H, W], not {list(rows.shape)}")
        if span[1] > rows.shape[dim]:
            raise InvalidField(f"{where}: {name} {list(span)} is out of range: the output has {rows.shape[dim]}")
    if sel.y is not None or sel.x is not None:
        while len(index) < rows.ndim - 2:
            index.append(slice(None))
        index.append(slice(*sel.y) if sel.y is not None else slice(None))
        index.append(slice(*sel.x) if sel.x is not None else slice(None))
    return tuple(index)


def _token_index(rows: Tensor, op: EditOp) -> tuple[Any, ...]:
    """Tokens along dim 1 and channels along the last dim of `[n, T, D]`, as an outer (not paired) index."""
    where = f"edit {op.index} at {op.attention or op.site!r}"
    if rows.ndim != 3:
        raise InvalidField(f"{where}: tokens need a token sequence [N, T, D], not {list(rows.shape)}")
    if op.token_count is not None and op.tokens is not None and rows.shape[1] != op.token_count:
        raise InvalidField(
            f"{where}: the tokens were chosen among {op.token_count} (the model's input size), and these inputs "
            f"give {rows.shape[1]}: send inputs of the model's input size"
        )
    channels = op.selection.channels
    if channels is not None and max(channels) >= rows.shape[2]:
        bad = [c for c in channels if c >= rows.shape[2]]
        raise InvalidField(f"{where}: channels {bad} are out of range: the tokens have {rows.shape[2]} channels")
    tokens = op.tokens
    if tokens is not None and channels is not None:
        return (slice(None), torch.tensor(tokens)[:, None], torch.tensor(channels)[None, :])
    return (
        slice(None),
        list(tokens) if tokens is not None else slice(None),
        list(channels) if channels is not None else slice(None),
    )


def _edited(region: Tensor, rows: Tensor, op: EditOp, request: RowEdits, index: tuple[Any, ...]) -> Tensor:
    where = f"edit {op.index} ({op.op} at {op.site!r})"
    if op.op == "zero":
        return torch.zeros_like(region)
    if op.op == "scale":
        return region * op.factor
    if op.op == "clamp":
        return region.clamp(min=op.low, max=op.high)
    if op.op == "add":
        if op.tensor is not None:
            return region + _per_sample(op.tensor, region, op, where)
        return region + (op.value or 0.0)
    if op.op == "set":
        assert op.tensor is not None  # the schema requires it
        return _per_sample(op.tensor, region, op, where).expand_as(region)
    if op.op == "noise":
        generator = torch.Generator(device=region.device).manual_seed(op.seed)
        noise = torch.randn(region.shape, generator=generator, device=region.device, dtype=torch.float32)
        return region + op.std * noise.to(region.dtype)
    if op.op == "mean":
        if op.over == "batch":
            clean = request.means(op.site, op.call, op.side).to(region.device)
            return clean[index].mean(0, keepdim=True).expand_as(region)
        if op.token_axis:  # a token sequence's "spatial" dim is its tokens
            return region.mean(dim=1, keepdim=True).expand_as(region)
        if rows.ndim < 3:
            raise InvalidField(f"{where}: the output {list(rows.shape[1:])} has no spatial dims to average over")
        return region.mean(dim=tuple(range(2, region.ndim)), keepdim=True).expand_as(region)
    if op.op == "patch":
        assert op.source is not None  # the schema requires it
        donor = request.donors(op.source, op.site, op.call, op.side).to(region.device)
        if donor.shape[1:] != rows.shape[1:]:
            raise InvalidField(
                f"{where}: the source {op.source!r} gives {list(donor.shape[1:])} at this site, the input "
                f"{list(rows.shape[1:])}: patching needs inputs of the same shape"
            )
        return donor[index].expand_as(region)
    raise InvalidField(f"{where}: unknown op")


def _per_sample(tensor: Tensor, region: Tensor, op: EditOp, where: str) -> Tensor:
    """A tensor shaped like one sample's selection (or one value per selected channel), broadcast over the rows."""
    sample = region.shape[1:]
    t = tensor.to(device=region.device, dtype=region.dtype)
    if tuple(t.shape) == tuple(sample):
        return t.unsqueeze(0)
    axis = -1 if op.token_axis else 0
    channels = len(op.selection.channels) if op.selection.channels is not None else (sample[axis] if sample else 0)
    if t.ndim == 1 and len(sample) >= 1 and t.shape[0] == channels:
        if op.token_axis:
            return t.reshape(1, *([1] * (len(sample) - 1)), channels)
        return t.reshape(1, channels, *([1] * (len(sample) - 1)))
    raise InvalidField(
        f"{where}: the tensor has shape {list(t.shape)}; the selection is {list(sample)} per input "
        f"(or give one value per selected channel, [{channels}])"
    )
