// A histogram of a tensor's values on a canvas: equal-width bins from its min to its max, zero marked when the
// values straddle it, and the counts behind the bars kept for people and tests (`data-counts`).

import { formatNumber, sharpContext } from "./dom.js";

const HEIGHT = 120; // css px
const BINS = 48;

/** Counts of `values` (finite ones) in `bins` equal-width bins over [lo, hi]; NaN and Inf counted apart. */
export function histogram(values, bins = BINS) {
  let lo = Infinity;
  let hi = -Infinity;
  let skipped = 0;
  for (const v of values) {
    if (!Number.isFinite(v)) {
      skipped += 1;
      continue;
    }
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  const counts = new Array(bins).fill(0);
  if (lo === Infinity) return { counts, lo: 0, hi: 0, skipped };
  const width = hi - lo || 1;
  for (const v of values) {
    if (!Number.isFinite(v)) continue;
    counts[Math.min(bins - 1, Math.floor(((v - lo) / width) * bins))] += 1;
  }
  return { counts, lo, hi, skipped };
}

/** Draw `values` into `canvas` (css width `width`); returns the histogram drawn. */
export function drawHistogram(canvas, values, width) {
  const found = histogram(values);
  const ctx = sharpContext(canvas, width, HEIGHT);
  const peak = Math.max(1, ...found.counts);
  const step = width / found.counts.length;
  ctx.fillStyle = "#1f5fbf";
  found.counts.forEach((count, i) => {
    if (!count) return;
    const h = Math.max(1, (count / peak) * (HEIGHT - 4));
    ctx.fillRect(i * step, HEIGHT - h, Math.max(step - 1, 1), h);
  });
  if (found.lo < 0 && found.hi > 0) {
    const x = ((0 - found.lo) / (found.hi - found.lo)) * width;
    ctx.fillStyle = "#c0392b";
    ctx.fillRect(x, 0, 1, HEIGHT);
  }
  canvas.dataset.counts = found.counts.join(",");
  canvas.dataset.lo = String(found.lo);
  canvas.dataset.hi = String(found.hi);
  return found;
}

/** "48 bins from -0.31 to 0.29 (a red line at zero); 4,704 values" */
export function describeHistogram(found, total) {
  const zero = found.lo < 0 && found.hi > 0 ? " (red line: zero)" : "";
  const skipped = found.skipped ? `; ${formatNumber(found.skipped)} NaN or Inf left out` : "";
  return `${found.counts.length} bins from ${formatNumber(found.lo)} to ${formatNumber(found.hi)}${zero}; `
    + `${formatNumber(total)} values, tallest bin ${formatNumber(Math.max(...found.counts))}${skipped}`;
}
