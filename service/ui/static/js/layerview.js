// One layer up close: its statistics (format=stats), its feature maps drawn here from the API's values
// (format=safetensors) in the layout of the API's PNG grid, and one channel of that grid enlarged on click or by
// number. Signed maps are drawn blue-white-red, symmetric about 0; non-negative ones black to white. Each channel on
// its own scale, or all on one shared scale; a colour bar beside the grid and the enlarged channel says which.

import { Slot, isAbort, postJSON } from "./api.js";
import { barAt, drawBars } from "./bars.js";
import { colourBar, hideColourBar, setColourBar } from "./colorbar.js";
import { DIVERGING, GRAY, position, rangeOf, scaleOf } from "./colormap.js";
import { clearError, el, formatNumber, formatShape, showError } from "./dom.js";
import { describeHistogram, drawHistogram } from "./histogram.js";
import { tokenGrid } from "./maps.js";
import { parseSafetensors } from "./safetensors.js";
import { readState, writeState } from "./state.js";
import { TokenView, tokenSequence } from "./tokenview.js";

const SEPARATOR = 2; // px between tiles, as in the API's grid (service/codecs/pictures.py)
const MIN_TILE = 32; // px: small maps are enlarged (nearest) to about this, as the API's grid does
const ENLARGED = 192; // px, the longer side of an enlarged channel
const SEPARATOR_COLOUR = { sequential: [255, 255, 255], diverging: [68, 68, 68] }; // white would hide 0 (white)

/**
 * The first input's maps of a layer's output as {data, channels, h, w}: `[N, C, h, w]` as is, `[N, h, w]` as one
 * map, a vision transformer's `[N, T, D]` tokens (with `tokens`, its layout) as D maps over the patch grid.
 */
export function featureMaps(tensor, tokens) {
  const each = tensor.shape.slice(1);
  const numel = each.reduce((a, b) => a * b, 1);
  const first = tensor.data.subarray(0, numel);
  const grid = tokenGrid(first, each, tokens);
  if (grid) return { data: grid.data, channels: grid.shape[0], h: grid.shape[1], w: grid.shape[2] };
  if (each.length === 3) return { data: first, channels: each[0], h: each[1], w: each[2] };
  if (each.length === 2) return { data: first, channels: 1, h: each[0], w: each[1] };
  if (each.length === 1) return { data: first, channels: each[0], h: 1, w: 1 };
  throw new Error(`the output has shape ${formatShape(tensor.shape)}; a grid of maps needs [N, C, H, W]`);
}

/** Each channel's scale: its own range, or the range of all `count` drawn, symmetric about 0 if any is below 0. */
export function tileScales(maps, count, shared) {
  const size = maps.h * maps.w;
  const all = scaleOf(rangeOf(maps.data.subarray(0, count * size)), GRAY);
  const scales = [];
  for (let c = 0; c < count; c += 1) {
    if (shared) {
      scales.push(all);
      continue;
    }
    const own = rangeOf(maps.data.subarray(c * size, (c + 1) * size));
    if (all.kind === "diverging") {
      const m = Math.max(-own.lo, own.hi, 0);
      scales.push({ kind: "diverging", lo: -m, hi: m, lut: DIVERGING });
    } else scales.push({ kind: "sequential", lo: own.lo, hi: own.hi, lut: GRAY });
  }
  return { all, scales };
}

/** The grid as a canvas: `count` tiles row-major in ceil(sqrt(count)) columns, SEPARATOR px apart. */
function gridCanvas(maps, count, scales, kind) {
  const { h, w, data } = maps;
  const zoom = Math.max(1, Math.ceil(MIN_TILE / Math.max(h, w)));
  const th = h * zoom;
  const tw = w * zoom;
  const cols = Math.ceil(Math.sqrt(count));
  const rows = Math.ceil(count / cols);
  const canvas = document.createElement("canvas");
  canvas.width = cols * tw + (cols - 1) * SEPARATOR;
  canvas.height = rows * th + (rows - 1) * SEPARATOR;
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(canvas.width, canvas.height);
  const out = image.data;
  const separator = SEPARATOR_COLOUR[kind];
  for (let i = 0; i < out.length; i += 4) {
    out[i] = separator[0];
    out[i + 1] = separator[1];
    out[i + 2] = separator[2];
    out[i + 3] = 255;
  }
  for (let c = 0; c < count; c += 1) {
    const { lut } = scales[c];
    const left = (c % cols) * (tw + SEPARATOR);
    const top = Math.floor(c / cols) * (th + SEPARATOR);
    for (let y = 0; y < th; y += 1) {
      for (let x = 0; x < tw; x += 1) {
        const k = Math.round(position(scales[c], data[c * h * w + Math.floor(y / zoom) * w + Math.floor(x / zoom)]) * 255) * 3;
        const o = ((top + y) * canvas.width + left + x) * 4;
        out[o] = lut[k];
        out[o + 1] = lut[k + 1];
        out[o + 2] = lut[k + 2];
      }
    }
  }
  ctx.putImageData(image, 0, 0);
  return canvas;
}

/** A vector per input: [N, K], or [N, C, 1, 1] (after global pooling). Drawn as bars, not one 1-pixel tile each. */
export function isVectorShape(shape) {
  if (!Array.isArray(shape)) return false;
  return shape.length === 2 || (shape.length === 4 && shape[2] === 1 && shape[3] === 1);
}

/** Nested lists of numbers, flattened in order. */
function flatten(data) {
  return Array.isArray(data) ? data.flatMap(flatten) : [Number(data)];
}

/** How many tiles the API draws for an output shape (first input): channels of [N, C, H, W], units of [N, K]. */
export function tileCount(shape) {
  if (!Array.isArray(shape) || shape.length < 2) return 1;
  if (shape.length === 2 || shape.length === 4) return shape[1];
  return 1;
}

/** The capture keys of one module's calls in an /activations answer: `relu`, `relu#2`, ... in call order. */
export function callKeys(keys, name) {
  const calls = keys.filter((k) => k === name || k.startsWith(`${name}#`));
  const number = (k) => (k === name ? 1 : Number(k.slice(name.length + 1)));
  return calls.sort((a, b) => number(a) - number(b));
}

export class LayerView {
  /** `onCall(name, call, shape)`: the call of the layer the view shows (1 unless the module runs several times). */
  constructor(panel, busy, onCall = () => {}) {
    this.panel = panel;
    this.busy = busy;
    this.onCall = onCall;
    this.callPicker = panel.querySelector("#call-picker");
    this.callSelect = panel.querySelector("#layer-call");
    this.callSelect.addEventListener("change", () => {
      writeState({ call: this.callSelect.value === "1" ? null : this.callSelect.value });
      this.refresh();
    });
    this.wantedCall = readState().call || "1";
    this.slot = new Slot();
    this.title = panel.querySelector("#layer-title");
    this.meta = panel.querySelector("#layer-meta");
    this.hint = panel.querySelector("#layer-hint");
    this.error = panel.querySelector("#layer-error");
    this.statsTable = panel.querySelector("#layer-stats");
    this.gridFigure = panel.querySelector("#grid-figure");
    this.grid = panel.querySelector("#grid");
    this.gridCaption = panel.querySelector("#grid-caption");
    this.channelsInput = panel.querySelector("#channels");
    this.channelInput = panel.querySelector("#channel");
    this.channelCanvas = panel.querySelector("#channel-canvas");
    this.channelCaption = panel.querySelector("#channel-caption");
    this.enlarged = panel.querySelector("#enlarged");
    this.scaleSelect = panel.querySelector("#grid-scale");
    const { scale } = readState();
    if (scale === "shared") this.scaleSelect.value = scale; // a shared link's scale ("channel", the default, is left out)
    this.scaleSelect.addEventListener("change", () => {
      writeState({ scale: this.scaleSelect.value === "channel" ? null : this.scaleSelect.value });
      this.drawGrid();
    });
    this.gridBar = colourBar("grid-colorbar");
    this.gridCaption.before(this.gridBar);
    this.channelBar = colourBar("channel-colorbar");
    this.channelCaption.before(this.channelBar);
    this.tokens = null; // a vision transformer's token layout (the model's INFO), to draw its tokens as maps
    this.tokenView = new TokenView(panel.querySelector("#token-view"));
    this.maps = null; // {data, channels, h, w}: the first input's maps of the layer shown
    this.scales = []; // each drawn channel's scale
    this.vectorFigure = panel.querySelector("#vector-figure");
    this.vectorCanvas = panel.querySelector("#vector-canvas");
    this.vectorCaption = panel.querySelector("#vector-caption");
    this.vectorUnit = panel.querySelector("#vector-unit");
    this.values = null;
    this.vectorCanvas.addEventListener("click", (event) => this.clickBar(event));
    this.vectorCanvas.addEventListener("keydown", (event) => this.stepBar(event));
    this.histogramButton = panel.querySelector("#act-histogram-button");
    this.histogramFigure = panel.querySelector("#act-histogram");
    this.histogramButton.addEventListener("click", () => this.showHistogram());
    this.captured = null; // {model, inputs, layer, key} of the view, for its histogram
    this.histogramSlot = new Slot();
    this.tiles = 0;
    this.gridUrl = null;
    const { channel } = readState(); // a shared link's enlarged channel
    if (channel !== undefined && /^\d+$/.test(channel)) this.channelInput.value = channel;
    this.grid.addEventListener("click", (event) => this.clickGrid(event));
    this.channelInput.addEventListener("change", () => this.enlarge(Number(this.channelInput.value)));
    this.channelsInput.addEventListener("change", () => this.refresh());
    this.context = null;
  }

  /** Show `layer` (from the tree) for `input` on `model`; with no input only its description. */
  show(model, layer, shape, input) {
    if (this.context && (this.context.layer.name !== layer.name || this.context.model !== model)) {
      this.callSelect.replaceChildren(); // another layer: its first call, not the last one's number
      this.wantedCall = "1";
      writeState({ call: null });
    }
    this.context = { model, layer, shape, input };
    this.refresh();
  }

  clear() {
    this.slot.cancel();
    this.context = null;
    this.title.textContent = "Pick a layer in the tree";
    this.meta.textContent = "";
    this.hint.hidden = true;
    this.reset();
    clearError(this.error);
  }

  reset() {
    this.callPicker.hidden = true;
    this.statsTable.hidden = true;
    this.gridFigure.hidden = true;
    this.enlarged.hidden = true;
    this.vectorFigure.hidden = true;
    this.tokenView.hide();
    this.values = null;
    this.histogramButton.hidden = true;
    this.histogramFigure.hidden = true;
    this.captured = null;
    this.panel.querySelector("#layer-controls").hidden = true;
    if (this.gridUrl) URL.revokeObjectURL(this.gridUrl);
    this.gridUrl = null;
    this.grid.removeAttribute("src");
    this.maps = null;
    this.scales = [];
    hideColourBar(this.gridBar);
    hideColourBar(this.channelBar);
  }

  async refresh() {
    if (!this.context) return;
    const { model, layer, shape, input } = this.context;
    const label = layer.name === "" ? "(model)" : layer.name;
    this.title.textContent = label;
    this.meta.textContent = `${layer.type} · ${formatNumber(layer.num_parameters)} parameters${shape ? ` · output ${formatShape(shape)}` : ""}`;
    clearError(this.error);
    this.hint.hidden = Boolean(input);
    if (!input) {
      this.slot.cancel();
      this.reset();
      return;
    }
    const signal = this.slot.next();
    const inputs = [{ image: input.b64 }];
    try {
      await this.busy.run(async () => {
        const stats = await postJSON("activations", { model, inputs, layers: [layer.name], format: "stats" }, signal);
        const keys = Object.keys(stats.activations);
        this.renderStats(stats.activations);
        const calls = callKeys(keys, layer.name);
        const key = calls.length ? this.pickCall(calls, stats.activations) : keys.find((k) => stats.activations[k].output) || keys[0];
        this.captured = { model, inputs, layer: layer.name, key };
        this.histogramFigure.hidden = true;
        this.histogramButton.hidden = false;
        const outShape = stats.activations[key] && stats.activations[key].output && stats.activations[key].output.shape;
        if (isVectorShape(outShape)) {
          const answer = await postJSON("activations", { model, inputs, layers: [layer.name] }, signal);
          this.showVector(key, outShape, flatten(answer.activations[key].output.data));
          return;
        }
        this.vectorFigure.hidden = true;
        const channels = Math.max(1, Math.min(1024, Number(this.channelsInput.value) || 64));
        const body = { model, inputs, layers: [layer.name], format: "safetensors" };
        const buffer = await postJSON("activations", body, signal, "arrayBuffer");
        const tensor = parseSafetensors(buffer).tensors[`${key}:output`];
        if (!tensor) throw new Error(`the answer has no ${key}:output`);
        this.captured.tensor = tensor; // its histogram needs no second request
        this.maps = featureMaps(tensor, this.tokens);
        if (tokenSequence(tensor.shape, this.tokens)) this.tokenView.show(key, tensor, this.tokens);
        else this.tokenView.hide();
        this.tiles = Math.min(this.maps.channels, channels);
        this.panel.querySelector("#layer-controls").hidden = false;
        this.outShape = outShape;
        await this.drawGrid();
      });
    } catch (error) {
      if (isAbort(error)) return;
      this.reset();
      showError(this.error, error);
    }
  }

  /** Draw the maps of the layer shown (first `this.tiles` channels) on the chosen scale, with its colour bar. */
  async drawGrid() {
    const maps = this.maps;
    if (!maps || !this.tiles) return;
    const drawing = (this.drawing = (this.drawing || 0) + 1);
    const shared = this.scaleSelect.value === "shared";
    const { all, scales } = tileScales(maps, this.tiles, shared);
    const canvas = gridCanvas(maps, this.tiles, scales, all.kind);
    const png = await new Promise((resolve) => canvas.toBlob(resolve, "image/png"));
    if (drawing !== this.drawing || this.maps !== maps) return; // a newer drawing, or another layer
    if (this.gridUrl) URL.revokeObjectURL(this.gridUrl);
    this.gridUrl = URL.createObjectURL(png);
    this.grid.src = this.gridUrl;
    await this.grid.decode();
    if (drawing !== this.drawing) return;
    this.scales = scales;
    const key = this.captured ? this.captured.key : "";
    const total = maps.channels;
    const how = shared ? "on one scale shared by the channels" : "each scaled to its own range";
    this.grid.alt = `Feature maps of ${key}: ${this.tiles} of ${total} channels, ${how}`;
    const words = shared ? "all on one shared scale" : "each on its own scale";
    this.gridCaption.textContent = `${key} ${formatShape(this.outShape)}: ${this.tiles} of ${total} channels, ${words}. Click one to enlarge it.`;
    const diverging = all.kind === "diverging";
    if (shared) setColourBar(this.gridBar, all, { scope: "shared scale across channels" });
    else {
      setColourBar(this.gridBar, all, {
        scope: "per-channel",
        ends: diverging
          ? { lo: "−max |v|", hi: "+max |v|", text: "each tile from −its own max |v| to +its own max |v|" }
          : { lo: "min", hi: "max", text: "each tile from its own min to its own max" },
        note: "the enlarged channel's bar gives its numbers",
      });
    }
    this.gridFigure.dataset.scale = shared ? "shared" : "channel";
    this.gridFigure.hidden = false;
    this.channelInput.max = String(this.tiles - 1);
    const current = Number(this.channelInput.value);
    this.enlarge(Number.isInteger(current) && current < this.tiles ? current : 0);
  }

  /**
   * A module run several times (lenet's relu: 4 calls) has one capture per call: pick which one the maps, the
   * statistics' highlight, the histogram and the interventions refer to.
   */
  pickCall(calls, activations) {
    const number = (k) => (k.includes("#") ? k.split("#").pop() : "1");
    const wanted = this.callSelect.value || this.wantedCall;
    const key = calls.find((k) => number(k) === wanted) || calls[0];
    this.callPicker.hidden = calls.length < 2;
    this.callSelect.replaceChildren(
      ...calls.map((k) => {
        const shape = activations[k].output ? activations[k].output.shape : null;
        return el("option", { value: number(k), text: `${number(k)} of ${calls.length}${shape ? ` · ${formatShape(shape)}` : ""}` });
      }),
    );
    this.callSelect.value = number(key);
    this.panel.querySelector("#call-note").textContent = calls.length > 1 ? `this module runs ${calls.length} times per forward` : "";
    const shape = activations[key].output ? activations[key].output.shape : null;
    const name = this.context.layer.name;
    this.meta.textContent = `${this.context.layer.type} · ${formatNumber(this.context.layer.num_parameters)} parameters`
      + `${shape ? ` · output ${formatShape(shape)}` : ""}${calls.length > 1 ? ` (call ${number(key)})` : ""}`;
    this.onCall(name, Number(number(key)), shape);
    return key;
  }

  /** Every value of the layer's output (the API's safetensors answer) as a histogram under its statistics. */
  async showHistogram() {
    const captured = this.captured;
    if (!captured) return;
    const { model, inputs, layer, key } = captured;
    const signal = this.histogramSlot.next();
    try {
      let tensor = captured.tensor;
      if (!tensor) {
        const body = { model, inputs, layers: [layer], format: "safetensors" };
        const buffer = await this.busy.run(() => postJSON("activations", body, signal, "arrayBuffer"));
        tensor = parseSafetensors(buffer).tensors[`${key}:output`];
      }
      if (!tensor) throw new Error(`the answer has no ${key}:output`);
      const canvas = this.panel.querySelector("#act-histogram-canvas");
      const found = drawHistogram(canvas, tensor.data, Math.max(240, Math.min(560, this.panel.clientWidth - 24)));
      this.panel.querySelector("#act-histogram-caption").textContent =
        `${key} output ${formatShape(tensor.shape)}: ${describeHistogram(found, tensor.data.length)}`;
      this.histogramFigure.dataset.key = key;
      this.histogramFigure.hidden = false;
    } catch (error) {
      if (!isAbort(error)) showError(this.error, error);
    }
  }

  /** The units of a vector-shaped output as bars on one shared scale, positive up in blue, negative down in red. */
  showVector(key, shape, values) {
    this.gridFigure.hidden = true;
    this.enlarged.hidden = true;
    this.tokenView.hide();
    this.panel.querySelector("#layer-controls").hidden = true;
    this.values = values;
    const canvas = this.vectorCanvas;
    const width = Math.max(240, Math.min(640, this.panel.clientWidth - 24));
    const { lo, hi } = drawBars(canvas, values, width);
    canvas.setAttribute("aria-label", `${values.length} units of ${key}, from ${formatNumber(lo)} to ${formatNumber(hi)}`);
    this.vectorCaption.textContent = `${key} ${formatShape(shape)}: ${values.length} units on one shared scale `
      + `(${formatNumber(lo)} to ${formatNumber(hi)}; blue above zero, red below). Click a bar, or use the arrow keys, for its value.`;
    this.vectorUnit.textContent = "";
    this.vectorFigure.hidden = false;
  }

  clickBar(event) {
    if (!this.values) return;
    this.showUnit(barAt(this.vectorCanvas, event, this.values.length));
  }

  stepBar(event) {
    if (!this.values || !["ArrowLeft", "ArrowRight"].includes(event.key)) return;
    event.preventDefault();
    const current = Number(this.vectorCanvas.dataset.unit ?? -1);
    this.showUnit(current + (event.key === "ArrowRight" ? 1 : -1));
  }

  showUnit(index) {
    const i = Math.max(0, Math.min(this.values.length - 1, index));
    this.vectorCanvas.dataset.unit = String(i);
    this.vectorUnit.textContent = `unit ${i}: ${formatNumber(this.values[i])}`;
  }

  renderStats(activations) {
    const rows = [];
    for (const [key, sides] of Object.entries(activations)) {
      for (const [side, s] of Object.entries(sides)) {
        rows.push(
          el(
            "tr",
            { "data-key": key },
            el("th", { scope: "row", title: formatShape(s.shape), text: side === "output" ? key : `${key} (${side})` }),
            ...["min", "max", "mean", "std"].map((k) => el("td", { class: "num", text: formatNumber(s[k]) })),
            el("td", { class: "num", text: `${(s.zero_fraction * 100).toFixed(1)} %` }),
          ),
        );
      }
    }
    const head = el(
      "tr",
      {},
      ["output", "min", "max", "mean", "std", "zeros"].map((h) => el("th", { scope: "col", text: h })),
    );
    this.statsTable.replaceChildren(
      el("caption", { class: "sr-only", text: "Statistics of the layer's output" }),
      el("thead", {}, head),
      el("tbody", {}, rows),
    );
    this.statsTable.hidden = false;
  }

  geometry() {
    const cols = Math.ceil(Math.sqrt(this.tiles));
    const rows = Math.ceil(this.tiles / cols);
    const w = (this.grid.naturalWidth - (cols - 1) * SEPARATOR) / cols;
    const h = (this.grid.naturalHeight - (rows - 1) * SEPARATOR) / rows;
    return { cols, rows, w, h };
  }

  clickGrid(event) {
    if (!this.tiles || !this.grid.naturalWidth) return;
    const rect = this.grid.getBoundingClientRect();
    const x = ((event.clientX - rect.left) / rect.width) * this.grid.naturalWidth;
    const y = ((event.clientY - rect.top) / rect.height) * this.grid.naturalHeight;
    const g = this.geometry();
    const col = Math.min(g.cols - 1, Math.floor(x / (g.w + SEPARATOR)));
    const row = Math.min(g.rows - 1, Math.floor(y / (g.h + SEPARATOR)));
    const index = row * g.cols + col;
    if (index < this.tiles) this.enlarge(index);
  }

  /** Crop channel `index` out of the grid and draw it large, pixels kept sharp. */
  enlarge(index) {
    if (!this.tiles || !this.grid.naturalWidth || !Number.isInteger(index) || index < 0 || index >= this.tiles) return;
    const g = this.geometry();
    const sx = (index % g.cols) * (g.w + SEPARATOR);
    const sy = Math.floor(index / g.cols) * (g.h + SEPARATOR);
    const scale = ENLARGED / Math.max(g.w, g.h);
    const canvas = this.channelCanvas;
    canvas.width = Math.round(g.w * scale);
    canvas.height = Math.round(g.h * scale);
    const ctx = canvas.getContext("2d");
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(this.grid, sx, sy, g.w, g.h, 0, 0, canvas.width, canvas.height);
    this.channelInput.value = String(index);
    const key = this.context ? this.context.layer.name || "(model)" : "";
    canvas.setAttribute("aria-label", `Channel ${index} of ${key}, enlarged`);
    this.channelCaption.textContent = `channel ${index}`;
    const own = this.scales[index];
    if (own) {
      const shared = this.scaleSelect.value === "shared";
      setColourBar(this.channelBar, own, { scope: shared ? "shared scale across channels" : `channel ${index}, own scale` });
    }
    this.enlarged.hidden = false;
    writeState({ channel: index || null });
  }
}
