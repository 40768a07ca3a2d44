"""What the browser tests do on /ui and read back from it, in the words of the page's controls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from playwright.sync_api import Page


@dataclass(frozen=True)
class Row:
    """One bar of the top-k chart as the page shows it."""

    index: int
    label: str
    score: float


def open_inspector(page: Page, query: str = "") -> None:
    """Load /ui (with a query string such as `model=lenet`) and wait until the model's layers are listed."""
    page.goto(f"/ui{('?' + query) if query else ''}")
    page.wait_for_selector("#tree-body .tree-row")


def pick_sample(page: Page, name: str) -> None:
    page.click(f'.sample[data-sample="{name}"]')
    page.wait_for_selector(f'.sample[data-sample="{name}"][aria-pressed="true"]')


def wait_prediction(page: Page) -> list[Row]:
    page.wait_for_selector('#predict-panel[data-state="done"][aria-busy="false"]')
    return top_k(page, "#topk-table")


def top_k(page: Page, table: str) -> list[Row]:
    rows: list[dict[str, Any]] = page.eval_on_selector_all(
        f"{table} tbody tr",
        "rows => rows.map(r => ({index: +r.dataset.index, label: r.dataset.label, score: +r.dataset.score}))",
    )
    return [Row(int(r["index"]), str(r["label"]), float(r["score"])) for r in rows]


def wait_pane(page: Page, pane: str, method: str) -> None:
    """Wait until pane `a` or `b` shows a finished result of `method`."""
    page.wait_for_selector(
        f'#pane-{pane}[data-state="done"][data-result-method="{method}"][aria-busy="false"]', timeout=120_000
    )


def heat_pixels(page: Page, pane: str) -> str:
    """The heatmap canvas of a pane as a data URL (equal strings: equal pictures)."""
    return str(page.eval_on_selector(f"#pane-{pane} canvas.heat", "c => c.toDataURL()"))


def choose_method(page: Page, pane: str, method: str) -> None:
    page.select_option(f"#{pane}-method", method)


def select_layer(page: Page, name: str) -> None:
    page.click(f'#tree-body .tree-row[data-layer="{name}"] .pick')
    wait_layer(page)


def wait_layer(page: Page) -> None:
    """The layer view has its picture: the feature-map grid, or the bars of a vector-shaped layer."""
    page.wait_for_selector("#grid-figure:not([hidden]), #vector-figure:not([hidden])")
    page.wait_for_selector('#layer-view[aria-busy="false"]')


def image_stats(page: Page, selector: str) -> dict[str, float]:
    """Width, height and the spread of gray values of an <img> or <canvas> (0 spread: a blank picture)."""
    script = """node => {
        const w = node.naturalWidth || node.width, h = node.naturalHeight || node.height;
        const c = document.createElement('canvas'); c.width = w; c.height = h;
        const ctx = c.getContext('2d', {willReadFrequently: true}); ctx.drawImage(node, 0, 0);
        const d = ctx.getImageData(0, 0, w, h).data;
        let min = 255, max = 0, sum = 0, sq = 0, n = 0;
        for (let i = 0; i < d.length; i += 4) {
            const v = d[i]; min = Math.min(min, v); max = Math.max(max, v); sum += v; sq += v * v; n += 1;
        }
        const mean = sum / n;
        return {width: w, height: h, min, max, std: Math.sqrt(sq / n - mean * mean)};
    }"""
    result: dict[str, float] = page.eval_on_selector(selector, script)
    return result


def no_horizontal_overflow(page: Page) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"))
