"""Find the distribution's Chromium for Playwright (never Playwright's own download) and say how to get it."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

INSTALL_HINT = (
    "Chromium not found: apt-get install -y --no-install-recommends chromium "
    "(or set HOOKSERVE_CHROMIUM to a Chromium binary)"
)
PLAYWRIGHT_HINT = "playwright is not installed: pip install -e '.[dev]'"
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
REQUIRE_ENV = "HOOKSERVE_REQUIRE_BROWSER"


def chromium_path() -> str | None:
    """`HOOKSERVE_CHROMIUM`, else the first Chromium on PATH, else Debian's binary; None when there is none."""
    configured = os.environ.get("HOOKSERVE_CHROMIUM")
    if configured:
        return configured if Path(configured).is_file() else None
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    debian = Path("/usr/lib/chromium/chromium")
    return str(debian) if debian.is_file() else None


def missing() -> str | None:
    """Why the browser tests cannot run here (how to fix it), or None when they can."""
    if importlib.util.find_spec("playwright") is None:
        return PLAYWRIGHT_HINT
    return INSTALL_HINT if chromium_path() is None else None


def browser_required() -> bool:
    """CI sets HOOKSERVE_REQUIRE_BROWSER=1: there a missing browser fails instead of skipping."""
    return os.environ.get(REQUIRE_ENV, "").lower() in ("1", "true", "yes")
