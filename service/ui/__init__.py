"""The inspector's static files (plain HTML, CSS and JavaScript, no build step), shipped in the package."""

from __future__ import annotations

from pathlib import Path

STATIC_DIR = Path(__file__).resolve().parent / "static"
