// A vector as bars on one shared scale: positive up in blue, negative down in red, a gray line at zero. Drawn for a
// vector-shaped layer ([N, K]) and for one token of a vision transformer ([N, T, D]).

import { sharpContext } from "./dom.js";

const POSITIVE = "#1f5fbf";
const NEGATIVE = "#c0392b";
export const BARS_HEIGHT = 140; // css px

/** Draw `values` as bars on `canvas`, `width` css px wide; returns the scale's ends {lo, hi} (0 always included). */
export function drawBars(canvas, values, width, height = BARS_HEIGHT) {
  let lo = 0;
  let hi = 0;
  for (const v of values) {
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  const ctx = sharpContext(canvas, width, height);
  const span = hi - lo || 1;
  const zero = height - ((0 - lo) / span) * height;
  const step = width / values.length;
  values.forEach((v, i) => {
    const y = height - ((v - lo) / span) * height;
    ctx.fillStyle = v >= 0 ? POSITIVE : NEGATIVE;
    ctx.fillRect(i * step, Math.min(y, zero), Math.max(step - (step > 3 ? 1 : 0), 0.5), Math.max(Math.abs(zero - y), 1));
  });
  ctx.fillStyle = "#666";
  ctx.fillRect(0, zero, width, 1);
  canvas.dataset.units = String(values.length);
  return { lo, hi };
}

/** The index of the bar under a pointer event on `canvas` drawn with `count` bars. */
export function barAt(canvas, event, count) {
  const rect = canvas.getBoundingClientRect();
  return Math.max(0, Math.min(count - 1, Math.floor(((event.clientX - rect.left) / rect.width) * count)));
}
