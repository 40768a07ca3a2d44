// A colour bar beside a heatmap or a grid of maps: the colours from one end of its scale to the other, the numbers at
// the ends, and a line saying in words how the values were normalised ("per-map min–max: 0.0012 … 0.53").

import { GRAY } from "./colormap.js";
import { el, formatNumber } from "./dom.js";

const MINUS = "\u2212";

/** A value as the bar writes it: 3 significant digits, a real minus sign. */
export function formatEnd(value) {
  const text = formatNumber(value, 3);
  return text.startsWith("-") ? `${MINUS}${text.slice(1)}` : text;
}

/** An empty bar, hidden until `setColourBar` fills it; `id` names it for aria-describedby. */
export function colourBar(id) {
  const canvas = el("canvas", { width: 256, height: 1 });
  const ticks = el("div", { class: "colorbar-ticks" }, el("span", { class: "lo" }), el("span", { class: "mid" }), el("span", { class: "hi" }));
  return el(
    "div",
    { class: "colorbar", id, role: "group", "aria-label": "Colour scale", hidden: true },
    el("div", { class: "colorbar-ramp", "aria-hidden": "true" }, canvas, ticks),
    el("p", { class: "colorbar-text" }),
    el("p", { class: "colorbar-note" }),
  );
}

/** What the colours mean on `scale` ("blue below 0, white at 0, red above"). */
function colours(scale, overlay) {
  const diverging = scale.kind === "diverging";
  const gray = scale.lut === GRAY;
  const words = diverging ? "blue below 0, white at 0, red above" : gray ? "black low, white high" : "dark low, bright yellow high";
  if (!overlay) return words;
  return `${words}; over the image, ${diverging ? "values near 0" : "low values"} are see-through`;
}

/**
 * Show `scale` ({kind, lo, hi, lut}) on `bar`. `scope` says over what the scale was taken: "per-map",
 * "shared scale across channels", "channel 5, own scale". `ends` (optional) replaces the numbers with words where
 * every tile has its own range ({lo: "min", hi: "max", text: "each tile from its own min to its own max"});
 * `overlay`: the map is drawn over an image;
 * `note`: a few more words after what the colours mean.
 */
export function setColourBar(bar, scale, { scope = "per-map", ends = null, overlay = false, note = "" } = {}) {
  const canvas = bar.querySelector("canvas");
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(256, 1);
  for (let k = 0; k < 256; k += 1) {
    image.data.set([scale.lut[k * 3], scale.lut[k * 3 + 1], scale.lut[k * 3 + 2], 255], k * 4);
  }
  ctx.putImageData(image, 0, 0);
  const diverging = scale.kind === "diverging";
  const lo = ends ? ends.lo : formatEnd(scale.lo);
  const hi = ends ? ends.hi : formatEnd(scale.hi);
  bar.querySelector(".lo").textContent = lo;
  bar.querySelector(".mid").textContent = diverging ? "0" : "";
  bar.querySelector(".hi").textContent = hi;
  const how = diverging ? `${scope}, symmetric about 0` : scope.startsWith("per-") ? `${scope} min–max` : `${scope}, min–max`;
  bar.querySelector(".colorbar-text").textContent = `${how}: ${ends && ends.text ? ends.text : `${lo} … ${hi}`}`;
  const flat = !ends && !(scale.hi > scale.lo) ? `every value is ${lo}, nothing stands out; ` : "";
  bar.querySelector(".colorbar-note").textContent = flat + colours(scale, overlay) + (note ? `; ${note}` : "");
  bar.dataset.kind = scale.kind;
  if (ends) {
    delete bar.dataset.lo;
    delete bar.dataset.hi;
  } else {
    bar.dataset.lo = String(scale.lo);
    bar.dataset.hi = String(scale.hi);
  }
  bar.dataset.scope = scope;
  bar.hidden = false;
}

export function hideColourBar(bar) {
  bar.hidden = true;
}
