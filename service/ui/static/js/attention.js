// The attention panel of a vision transformer: one block's probabilities (POST /attention, every query row, as
// safetensors), drawn over the image for the class token or a clicked patch, for one head or their mean; every head
// of the block as small multiples; and attention rollout beside gradient-weighted attention (POST /saliency).

import { Slot, isAbort, postJSON } from "./api.js";
import { colourBar, formatEnd, hideColourBar, setColourBar } from "./colorbar.js";
import { paintHeatmap, scaleFor } from "./colormap.js";
import { clearError, el, showError } from "./dom.js";
import { drawModelView } from "./image.js";
import { parseSafetensors } from "./safetensors.js";
import { writeState } from "./state.js";

const MEAN = "mean";
const RELEVANCE = [
  ["attention_rollout", "Attention rollout", "the class token's attention multiplied through every block (heads averaged)"],
  ["gradient_weighted_attention", "Gradient-weighted attention", "relevance through grad × attention, for the target"],
];

/** Paint `values` over the image on their own scale (min–max; symmetric about 0 if signed); returns the scale. */
function paintOver(canvas, values, rows, cols) {
  const scale = scaleFor(values);
  paintHeatmap(canvas, values, rows, cols, scale, { overlay: true });
  return scale;
}

function stack(label) {
  const base = el("canvas", { class: "base", "aria-hidden": "true" });
  const heat = el("canvas", { class: "heat pixelated", "aria-hidden": "true" });
  const marker = el("canvas", { class: "marker", "aria-hidden": "true" });
  const box = el("div", { class: "stack", role: "img", "aria-label": label }, base, heat, marker);
  return { box, base, heat, marker };
}

export class AttentionPanel {
  /** `app.current()` gives {model, input, preprocess, target}; `busy` spins the panel's spinner. */
  constructor(root, busy, app, state) {
    this.root = root;
    this.busy = busy;
    this.app = app;
    this.info = null;
    this.maps = null; // {heads, tokens, data: Float32Array [H, T, T]}
    this.query = Number.isInteger(Number(state.query)) && state.query !== undefined ? Number(state.query) : null;
    this.wanted = { block: state.block, head: state.head };
    this.slot = new Slot();
    this.relevanceSlots = RELEVANCE.map(() => new Slot());
    this.block = root.querySelector("#attention-block");
    this.head = root.querySelector("#attention-head");
    this.error = root.querySelector("#attention-error");
    this.caption = root.querySelector("#attention-caption");
    this.main = stack("No attention map yet");
    this.main.box.tabIndex = 0;
    this.main.box.id = "attention-stack";
    this.mainBar = colourBar("attention-colorbar");
    this.main.box.setAttribute("aria-describedby", "attention-colorbar");
    root.querySelector("#attention-main").prepend(this.main.box, this.mainBar);
    this.grid = root.querySelector("#attention-heads");
    this.headsBar = colourBar("attention-heads-colorbar");
    this.grid.after(this.headsBar);
    this.relevance = RELEVANCE.map(([method, title, help]) => {
      const view = stack(`No ${title.toLowerCase()} yet`);
      const bar = colourBar(`${method}-colorbar`);
      view.box.setAttribute("aria-describedby", `${method}-colorbar`);
      const caption = el("figcaption", { text: help });
      const figure = el("figure", { class: "overlay", "data-method": method }, el("h3", { text: title }), view.box, bar, caption);
      return { method, title, view, bar, caption, figure };
    });
    root.querySelector("#attention-relevance").replaceChildren(...this.relevance.map((r) => r.figure));
    this.block.addEventListener("change", () => {
      writeState({ block: this.block.value });
      this.run();
    });
    this.head.addEventListener("change", () => {
      writeState({ head: this.head.value });
      this.draw();
    });
    root.querySelector("#attention-cls").addEventListener("click", () => this.setQuery(null));
    root.querySelector("#attention-form").addEventListener("submit", (event) => event.preventDefault());
    this.main.box.addEventListener("click", (event) => this.clickPatch(event));
    this.main.box.addEventListener("keydown", (event) => this.keyPatch(event));
  }

  /** Show the panel for a model whose INFO lists attention modules; hide it otherwise. */
  setModel(info) {
    this.slot.cancel();
    this.info = info && info.attention ? info.attention : null;
    this.maps = null;
    this.root.hidden = !this.info;
    if (!this.info) return;
    const modules = this.info.modules;
    this.block.replaceChildren(...modules.map((m) => el("option", { value: m, text: m })));
    const block = modules.includes(this.wanted.block) ? this.wanted.block : modules[modules.length - 1];
    this.block.value = block;
    const heads = Math.max(...this.info.heads);
    this.head.replaceChildren(
      el("option", { value: MEAN, text: "mean of heads" }),
      ...Array.from({ length: heads }, (_, h) => el("option", { value: String(h), text: `head ${h}` })),
    );
    this.head.value = this.wanted.head !== undefined && this.wanted.head !== null ? String(this.wanted.head) : MEAN;
    if (!this.head.value) this.head.value = MEAN;
    this.wanted = {};
    this.clearViews("Give an image to see where the heads look.");
  }

  /** Fetch the chosen block's maps for the current image (every query row), then draw; and both relevance maps. */
  async run() {
    const { model, input } = this.app.current();
    if (!this.info || !model || !input) return;
    clearError(this.error);
    const signal = this.slot.next();
    const body = { model, inputs: [{ image: input.b64 }], blocks: [this.block.value], queries: "all", format: "safetensors" };
    this.root.dataset.state = "running";
    this.runRelevance();
    try {
      const buffer = await this.busy.run(() => postJSON("attention", body, signal, "arrayBuffer"));
      const { metadata, tensors } = parseSafetensors(buffer);
      const answer = JSON.parse(metadata.response || "{}");
      const found = tensors[this.block.value];
      if (!found) throw new Error("the answer has no map of this block");
      const [, heads, rows, keys] = found.shape;
      this.maps = { heads, rows, keys, tokens: answer.tokens, data: found.data };
      if (this.query !== null && this.query >= keys) this.query = null;
      this.draw();
      this.root.dataset.state = "done";
    } catch (error) {
      if (isAbort(error)) return;
      this.root.dataset.state = "error";
      this.maps = null;
      this.clearViews("");
      showError(this.error, error);
    }
  }

  /** Attention rollout and gradient-weighted attention for the current image and target. */
  runRelevance() {
    const { model, input, preprocess, target } = this.app.current();
    if (!this.info || !model || !input) return;
    this.relevance.forEach(async (view, i) => {
      const signal = this.relevanceSlots[i].next();
      const body = { model, inputs: [{ image: input.b64 }], method: view.method, format: "safetensors" };
      if (target !== null) body.target = target;
      view.figure.dataset.state = "running";
      try {
        const buffer = await this.busy.run(() => postJSON("saliency", body, signal, "arrayBuffer"));
        const { metadata, tensors } = parseSafetensors(buffer);
        const result = (JSON.parse(metadata.response || "{}").results || [])[0];
        const attribution = tensors["0:attribution"];
        const [rows, cols] = attribution.shape;
        drawModelView(view.view.base, input, preprocess, null);
        const scale = paintOver(view.view.heat, attribution.data, rows, cols);
        setColourBar(view.bar, scale, { overlay: true });
        this.clearMarker(view.view);
        const label = result ? result.label ?? String(result.target) : "?";
        view.caption.textContent = `${view.title}: class ${label} · ${rows}×${cols} patches, class token's row`;
        view.view.box.setAttribute("aria-label", `${view.title} for class ${label} over the image`);
        view.figure.dataset.state = "done";
      } catch (error) {
        if (isAbort(error)) return;
        view.figure.dataset.state = "error";
        showError(this.error, error);
      }
    });
  }

  /** The chosen head's (or the heads' mean) attention from the current query over the patch tokens. */
  rowOver(head) {
    const { heads, rows, keys, data } = this.maps;
    const query = this.query ?? 0;
    const out = new Float32Array(keys);
    const chosen = head === MEAN ? [...Array(heads).keys()] : [Number(head)];
    for (const h of chosen) {
      const start = (h * rows + query) * keys;
      for (let k = 0; k < keys; k += 1) out[k] += data[start + k] / chosen.length;
    }
    const prefix = this.maps.tokens ? this.maps.tokens.prefix.length : 0;
    return out.subarray(prefix);
  }

  draw() {
    if (!this.maps || !this.maps.tokens) return;
    const { input, preprocess } = this.app.current();
    const [rows, cols] = this.maps.tokens.grid;
    const head = this.head.value;
    drawModelView(this.main.base, input, preprocess, null);
    const scale = paintOver(this.main.heat, this.rowOver(head), rows, cols);
    setColourBar(this.mainBar, scale, { overlay: true });
    this.drawMarker(this.main);
    const who = this.queryName();
    const which = head === MEAN ? "the mean of its heads" : `head ${head}`;
    this.caption.textContent = `${this.block.value}, ${which}: where ${who} looks (${rows}×${cols} patches)`;
    this.main.box.setAttribute("aria-label", `Attention of ${who} over the image, ${this.block.value}, ${which}`);
    this.root.dataset.query = String(this.query ?? 0);
    const tiles = [];
    let kind = null;
    for (let h = 0; h < this.maps.heads; h += 1) {
      const view = stack(`head ${h}`);
      drawModelView(view.base, input, preprocess, null);
      const own = paintOver(view.heat, this.rowOver(String(h)), rows, cols);
      if (!kind || own.kind === "diverging") kind = own;
      view.box.setAttribute("aria-label", `head ${h}, from ${formatEnd(own.lo)} to ${formatEnd(own.hi)}`);
      this.drawMarker(view);
      const pressed = head === String(h);
      tiles.push(
        el(
          "button",
          {
            type: "button",
            class: "head-tile",
            "aria-pressed": String(pressed),
            title: `Show head ${h} (its own scale: ${formatEnd(own.lo)} … ${formatEnd(own.hi)})`,
            onclick: () => {
              this.head.value = String(h);
              writeState({ head: String(h) });
              this.draw();
            },
          },
          view.box,
          el("span", { text: `head ${h}` }),
        ),
      );
    }
    this.grid.replaceChildren(...tiles);
    const diverging = kind.kind === "diverging";
    setColourBar(this.headsBar, kind, {
      scope: "per-head",
      ends: diverging
        ? { lo: "−max |v|", hi: "+max |v|", text: "each head from −its own max |v| to +its own max |v|" }
        : { lo: "min", hi: "max", text: "each head from its own min to its own max" },
      overlay: true,
      note: "a tile's title gives its range",
    });
  }

  queryName() {
    const tokens = this.maps && this.maps.tokens;
    if (!tokens || this.query === null) return tokens && tokens.prefix.length ? `the ${tokens.prefix[0]} token` : "token 0";
    if (this.query < tokens.prefix.length) return `the ${tokens.prefix[this.query]} token`;
    const patch = this.query - tokens.prefix.length;
    return `patch (${Math.floor(patch / tokens.grid[1])}, ${patch % tokens.grid[1]})`;
  }

  setQuery(query) {
    this.query = query;
    writeState({ query: query === null ? null : String(query) });
    this.draw();
  }

  /** A click on the image picks the patch under it as the query. */
  clickPatch(event) {
    if (!this.maps || !this.maps.tokens) return;
    const box = this.main.box.getBoundingClientRect();
    const [rows, cols] = this.maps.tokens.grid;
    const col = Math.min(cols - 1, Math.max(0, Math.floor(((event.clientX - box.left) / box.width) * cols)));
    const row = Math.min(rows - 1, Math.max(0, Math.floor(((event.clientY - box.top) / box.height) * rows)));
    this.setQuery(this.maps.tokens.prefix.length + row * cols + col);
  }

  /** Arrow keys move the query patch; Escape goes back to the class token. */
  keyPatch(event) {
    if (!this.maps || !this.maps.tokens) return;
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
    if (event.key === "Escape") {
      event.preventDefault();
      this.setQuery(null);
      return;
    }
    const move = moves[event.key];
    if (!move) return;
    event.preventDefault();
    const prefix = this.maps.tokens.prefix.length;
    const [rows, cols] = this.maps.tokens.grid;
    const patch = this.query === null || this.query < prefix ? 0 : this.query - prefix;
    const row = Math.min(rows - 1, Math.max(0, Math.floor(patch / cols) + move[0]));
    const col = Math.min(cols - 1, Math.max(0, (patch % cols) + move[1]));
    this.setQuery(prefix + row * cols + col);
  }

  drawMarker(view) {
    const tokens = this.maps.tokens;
    const canvas = view.marker;
    const [rows, cols] = tokens.grid;
    canvas.width = cols * 8;
    canvas.height = rows * 8;
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    if (this.query === null || this.query < tokens.prefix.length) return;
    const patch = this.query - tokens.prefix.length;
    ctx.strokeStyle = "#38bdf8";
    ctx.lineWidth = 2;
    ctx.strokeRect((patch % cols) * 8 + 1, Math.floor(patch / cols) * 8 + 1, 6, 6);
  }

  clearMarker(view) {
    view.marker.width = 1;
    view.marker.height = 1;
  }

  clearViews(caption) {
    for (const view of [this.main, ...this.relevance.map((r) => r.view)]) {
      for (const canvas of [view.base, view.heat, view.marker]) {
        canvas.width = 1;
        canvas.height = 1;
      }
    }
    this.grid.replaceChildren();
    this.caption.textContent = caption;
    for (const bar of [this.mainBar, this.headsBar, ...this.relevance.map((r) => r.bar)]) hideColourBar(bar);
    for (const r of this.relevance) r.caption.textContent = "";
  }

  clear() {
    this.slot.cancel();
    for (const slot of this.relevanceSlots) slot.cancel();
    this.maps = null;
    this.root.dataset.state = "";
    this.clearViews("Give an image to see where the heads look.");
  }

  /** For tests and people: the probabilities drawn now, over the patch tokens. */
  drawn() {
    return this.maps ? Array.from(this.rowOver(this.head.value)) : null;
  }
}
