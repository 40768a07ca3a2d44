"""What a checkpoint file holds, optionally compared with a served model; no pickle is ever run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from service.dataplane.base import PlaneBase
from service.introspection.checkpoint import inspect_checkpoint
from service.introspection.checkpoint_scan import CheckpointLimits
from service.registry.paths import resolve_under


class Checkpoints(PlaneBase):
    async def inspect_checkpoint(self, path: Path, compare_to: str | None, stats: bool) -> dict[str, Any]:
        """Inspect a file on this machine (an upload spooled to disk, or `checkpoint_path`'s result)."""
        s = self.settings
        limits = CheckpointLimits(s.max_checkpoint_entries, s.max_checkpoint_depth, s.max_checkpoint_scan_s)
        if compare_to is None:
            return await self.off_loop(inspect_checkpoint, path, None, stats, limits)
        served = self.ready(compare_to)
        module = served.model.module
        return await served.executor.run_shared(lambda: inspect_checkpoint(path, module, stats, limits))

    def checkpoint_path(self, relative: str) -> Path:
        """A server-side checkpoint path, resolved under the model dir (403 outside, 404 missing)."""
        return resolve_under(self.settings.model_dir, relative)
