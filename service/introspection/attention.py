"""Attention probabilities of vision transformers, read by hooks, never by changing model code.

timm's attention modules compute the softmax inside `F.scaled_dot_product_attention` while `fused_attn`
is on, so no hook ever sees the probabilities. With `fused_attn` off they take the explicit path
`softmax(q kᵀ · scale + bias) -> attn_drop -> @ v`, and a forward hook on `attn_drop` (the identity
in eval mode) receives the probabilities `[N, heads, T, T]`: what `timm.utils.AttentionExtract` reads.
`unfused` turns the flag off on the chosen modules of one module tree (a hook lane) for one batch and
restores it in `finally`, so predictions keep the fused kernel.

Which modules qualify is a table of timm classes checked by name: others that look like attention are
refused with the reason their probabilities cannot be read (linear attention never forms them).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from torch import Tensor, nn

from service.errors import InvalidField
from service.introspection.hooks import HookScope
from service.introspection.layers import resolve_layers

SUPPORTED = {
    "timm.layers.attention.Attention": "ViT, DeiT",
    "timm.layers.attention.AttentionRope": "ViTs with rotary embeddings",
    "timm.models.beit.Attention": "BEiT",
    "timm.models.eva.EvaAttention": "EVA",
}
"""Classes whose unfused forward hands the probabilities to `attn_drop` (checked against timm's source)."""

REASONS = {
    "LiteMLA": "multi-scale linear attention (ReLU kernels, no softmax): it never forms attention probabilities",
    "WindowAttention": (
        "attention within shifted local windows: its probabilities are per window ([windows, heads, 49, 49]), "
        "not one map over the image's tokens"
    ),
    "CascadedGroupAttention": "its softmax runs inside the forward with no module after it for a hook to read",
    "LocalWindowAttention": "attention within local windows, its softmax inside the forward where no hook reaches",
    "TalkingHeadAttn": "talking-heads attention mixes the heads after the softmax, so no map belongs to one head",
    "DiffAttention": "differential attention: its map is the difference of two softmax maps",
    "ClassAttn": "class attention: only the class token queries, in blocks apart from the self-attention",
}
_LOOKS_LIKE_ATTENTION = re.compile(r"Att(n|ention)|MLA")
_UNREADABLE = "its softmax runs inside the forward with no module after it for a hook to read"


@dataclass(frozen=True)
class AttentionSite:
    """A self-attention module whose probabilities hooks can read: its heads, and where its heads' outputs meet.

    `heads_at` is the module whose input is the heads' outputs side by side (`[N, T, heads * head_dim]`,
    head h at channels h*head_dim ... (h+1)*head_dim - 1): the module's `norm` when it has one, else `proj`.
    """

    name: str
    kind: str
    heads: int
    head_dim: int
    heads_at: str

    @property
    def probabilities_at(self) -> str:
        return f"{self.name}.attn_drop"


@dataclass(frozen=True)
class Unsupported:
    kind: str
    names: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class AttentionModules:
    """A model's readable attention modules (in `named_modules()` order) and the attention it cannot read."""

    sites: dict[str, AttentionSite] = field(default_factory=dict)
    unsupported: tuple[Unsupported, ...] = ()

    def require(self, model: str) -> None:
        """A 422 naming why, for a model without a readable attention module."""
        why = self.refusal(model)
        if why is not None:
            raise InvalidField(why)

    def refusal(self, model: str) -> str | None:
        """Why attention maps of `model` cannot be read; None when they can."""
        if self.sites:
            return None
        if not self.unsupported:
            return f"{model} has no attention modules: attention maps need a vision transformer"
        found = "; ".join(
            f"{u.kind} ({len(u.names)} module{'s' if len(u.names) > 1 else ''}, e.g. {u.names[0]!r}): {u.reason}"
            for u in self.unsupported
        )
        return (
            f"{model}'s attention does not expose probabilities. {found}. Attention maps are read from "
            f"{', '.join(sorted({c.rsplit('.', 1)[-1] + ' (' + f + ')' for c, f in SUPPORTED.items()}))}"
        )


def attention_modules(model: nn.Module) -> AttentionModules:
    """The model's attention modules: those whose probabilities hooks can read, and the others with why not."""
    sites: dict[str, AttentionSite] = {}
    others: dict[str, list[str]] = {}
    for name, module in model.named_modules():
        cls = type(module)
        qualified = f"{cls.__module__}.{cls.__qualname__}"
        if qualified in SUPPORTED and _readable(module):
            sites[name] = _site(name, module)
        elif _LOOKS_LIKE_ATTENTION.search(cls.__name__) and not any(name.startswith(f"{s}.") for s in sites):
            others.setdefault(cls.__name__, []).append(name)
    unsupported = tuple(
        Unsupported(kind, tuple(names), REASONS.get(kind, _UNREADABLE))
        for kind, names in others.items()
        if not any(n in sites or any(s.startswith(f"{n}.") for s in sites) for n in names)
    )
    return AttentionModules(sites, unsupported)


def _readable(module: nn.Module) -> bool:
    drop = getattr(module, "attn_drop", None)
    heads = getattr(module, "num_heads", None)
    return isinstance(drop, nn.Module) and hasattr(module, "fused_attn") and isinstance(heads, int)


def _site(name: str, module: nn.Module) -> AttentionSite:
    heads: int = getattr(module, "num_heads")  # noqa: B009 (checked to be an int by `_readable`)
    proj = module.get_submodule("proj")
    width = int(proj.in_features) if isinstance(proj, nn.Linear) else heads
    at = "norm" if isinstance(getattr(module, "norm", None), nn.Module) else "proj"
    return AttentionSite(name, type(module).__name__, heads, max(1, width // heads), f"{name}.{at}")


def sites_named(found: AttentionModules, layer_names: Sequence[str], chosen: Sequence[str], limit: int) -> list[str]:
    """The attention modules at or under the chosen module paths or fnmatch patterns (a block names its
    attention module), in model order; a 422 for a name or pattern that holds none, or more than `limit`."""
    picked: set[str] = set()
    for pattern in chosen:
        names = resolve_layers(layer_names, [pattern], len(layer_names))
        under = {s for s in found.sites for n in names if s == n or s.startswith(f"{n}.")}
        if not under:
            listed = ", ".join(repr(s) for s in list(found.sites)[:6]) + (", ..." if len(found.sites) > 6 else "")
            raise InvalidField(f"blocks: {pattern!r} holds no attention module; the model's are {listed}")
        picked |= under
    if len(picked) > limit:
        raise InvalidField(f"blocks: {len(picked)} attention modules, more than the limit of {limit} (max_layers)")
    return [s for s in found.sites if s in picked]


@contextmanager
def unfused(model: nn.Module, names: Sequence[str]) -> Iterator[None]:
    """`fused_attn` off on the named attention modules of `model` for the block, restored in `finally`."""
    modules = [model.get_submodule(name) for name in dict.fromkeys(names)]
    before = [bool(m.fused_attn) for m in modules]
    try:
        for m in modules:
            setattr(m, "fused_attn", False)  # noqa: B010 (timm reads it every forward; Final only for TorchScript)
        yield
    finally:
        for m, was in zip(modules, before, strict=True):
            setattr(m, "fused_attn", was)  # noqa: B010


Keep = Callable[[str, Tensor], None]


def record_probabilities(scope: HookScope, model: nn.Module, sites: Sequence[AttentionSite], keep: Keep) -> None:
    """Forward hooks on each site's `attn_drop` calling `keep(key, probabilities)` (`name`, `name#2`, ...).

    The probabilities are the hook's very tensor (the identity's output in eval mode), so a caller that
    differentiates with respect to them reads their gradient; callers that keep them copy them.
    """
    for site in sites:
        calls = [0]

        def hook(
            module: nn.Module, args: object, output: object, site: AttentionSite = site, calls: list[int] = calls
        ) -> None:
            calls[0] += 1
            if isinstance(output, Tensor):
                keep(site.name if calls[0] == 1 else f"{site.name}#{calls[0]}", output)

        scope.add(model.get_submodule(site.probabilities_at).register_forward_hook(hook))


def fused_flags(model: nn.Module) -> dict[str, bool]:
    """`fused_attn` of every attention module that has one (what tests and INFO check is restored)."""
    return {name: bool(m.fused_attn) for name, m in model.named_modules() if hasattr(m, "fused_attn")}


def forward_with_probabilities(model: nn.Module, x: Tensor) -> tuple[object, list[Tensor]]:
    """`model(x)` with every readable attention module unfused: its output and each block's probabilities
    `[N, heads, T, T]` in the order they ran (attached to autograd's graph when the caller records one)."""
    sites = list(attention_modules(model).sites.values())
    maps: list[Tensor] = []
    with unfused(model, [s.name for s in sites]), HookScope(model) as scope:
        record_probabilities(scope, model, sites, lambda key, t: maps.append(t))
        output = model(x)
    return output, maps
