// One saliency pane: a method picker, that method's parameters as form fields (from /openapi.json),
// and the attribution over the image as the model sees it, with its colour bar. The panel holds two panes side by
// side. A signed attribution is drawn blue-white-red, symmetric about 0; a non-negative one through inferno.

import { Slot, isAbort, postJSON } from "./api.js";
import { colourBar, hideColourBar, setColourBar } from "./colorbar.js";
import { INFERNO, paintHeatmap, resize, scaleFor } from "./colormap.js";
import { Busy, clearError, el, formatNumber, showError, spinner } from "./dom.js";
import { drawModelView } from "./image.js";
import { signedMap } from "./maps.js";
import { parseSafetensors } from "./safetensors.js";
import { clearPaneParams, paneParams, writeState } from "./state.js";

const SMALL_INPUT = 96; // px: smaller inputs (a 32×32 digit) are shown with sharp pixels

function inputFor(field, id, errorId) {
  const common = { id, name: field.name, "aria-describedby": `${id}-help ${errorId}` };
  if (field.kind === "enum") {
    const select = el("select", common, field.choices.map((c) => el("option", { value: c, text: c })));
    if (field.nullable) select.prepend(el("option", { value: "", text: "(default)" }));
    select.value = field.default === null ? "" : String(field.default);
    return select;
  }
  if (field.kind === "boolean") {
    return el("input", { ...common, type: "checkbox", checked: Boolean(field.default) });
  }
  if (field.kind === "integer" || field.kind === "number") {
    return el("input", {
      ...common,
      type: "number",
      step: field.kind === "integer" ? "1" : "any",
      min: field.minimum ?? undefined,
      max: field.maximum !== null && field.maximum < 1e15 ? field.maximum : undefined,
      value: field.default === null ? "" : String(field.default),
      placeholder: field.nullable ? "default" : undefined,
    });
  }
  const value = field.default === null ? "" : Array.isArray(field.default) ? field.default.join(",") : String(field.default);
  const hint = field.kind === "array" ? "comma-separated" : field.nullable ? "default" : undefined;
  return el("input", { ...common, type: "text", value, placeholder: hint, autocomplete: "off", spellcheck: false });
}

/**
 * What a pane draws of an answer: the attribution as one signed map (`signedMap`), resized to the heatmap's size as
 * the API resizes it, on its own scale; the API's heatmap (min–max scaled to [0, 1]) when there is no attribution.
 */
export function drawnMap(tensors, tokens) {
  const heatmap = tensors["0:heatmap"];
  const [height, width] = heatmap.shape.length === 2 ? heatmap.shape : [1, heatmap.data.length];
  const map = signedMap(tensors["0:attribution"], tokens);
  if (!map || map.values.length !== map.h * map.w || !map.values.length) {
    const scale = { kind: "sequential", lo: 0, hi: 1, lut: INFERNO };
    return { values: heatmap.data, height, width, scale, scope: "per-map", notes: ["the API's heatmap of |attribution|"] };
  }
  const notes = [];
  if (map.planes > 1) notes.push("at each pixel, the channel with the largest |attribution|");
  if (map.h !== height || map.w !== width) notes.push(`resized from ${map.h}×${map.w}`);
  const values = resize(map.values, map.h, map.w, height, width);
  return { values, height, width, scale: scaleFor(map.values), scope: "per-map", notes };
}

function readField(field, input) {
  if (field.kind === "boolean") return input.checked;
  const raw = input.value.trim();
  if (raw === "") return undefined; // the server's default
  if (field.kind === "integer") return Number.isNaN(Number(raw)) ? raw : Number(raw);
  if (field.kind === "number") return Number.isNaN(Number(raw)) ? raw : Number(raw);
  if (field.kind === "array") {
    const parts = raw.split(",").map((p) => p.trim()).filter(Boolean);
    return field.itemKind === "integer" || field.itemKind === "number" ? parts.map(Number) : parts;
  }
  if (field.kind === "string" && /^[[{]/.test(raw)) {
    try {
      return JSON.parse(raw);
    } catch {
      return raw;
    }
  }
  return raw;
}

/** A dry run's answer in a few words: "≈ 3,025 forwards · ~110 s", or why it would be refused. */
export function describeCost(cost) {
  const work = `≈ ${formatNumber(cost.forwards)} forward${cost.forwards === 1 ? "" : "s"}`;
  const backwards = cost.backwards ? ` + ${formatNumber(cost.backwards)} backward${cost.backwards === 1 ? "" : "s"}` : "";
  const seconds = cost.seconds < 1 ? "< 1 s" : `~${formatNumber(Math.round(cost.seconds))} s`;
  const refused = cost.refusal ? ` · would be refused: ${cost.refusal}` : "";
  return `${work}${backwards} · ${seconds}${refused}`;
}

/** A control's value as the URL keeps it ("" removes it: the server's default). */
function controlText(field, input) {
  return field.kind === "boolean" ? String(input.checked) : input.value.trim();
}

function setControl(field, input, text) {
  if (field.kind === "boolean") input.checked = text === "true";
  else input.value = text;
}

export class SaliencyPane {
  /** `app` gives `current()` → {model, input, preprocess, target}, and `targetError` for target details. */
  constructor(root, id, heading, app, onMethod) {
    this.root = root;
    this.id = id;
    this.app = app;
    this.onMethod = onMethod;
    this.methods = [];
    this.method = null;
    this.fields = [];
    this.slot = new Slot();
    this.methodSelect = el("select", { id: `${id}-method`, "aria-describedby": `${id}-method-error` });
    this.methodSelect.addEventListener("change", () => {
      this.setMethod(this.methodSelect.value);
      this.onMethod(this.method);
      this.run();
    });
    this.methodError = el("p", { class: "error", id: `${id}-method-error`, role: "alert", hidden: true });
    this.paramsBox = el("div", { class: "params" });
    this.runButton = el("button", { type: "submit", class: "run", text: "Run" });
    this.cancelButton = el("button", { type: "button", class: "cancel", text: "Cancel", hidden: true });
    this.cancelButton.addEventListener("click", () => this.cancel());
    // what the request would cost (the API's dry run), and while it runs, for how long it has been running
    this.estimate = el("span", { class: "estimate", id: `${id}-estimate`, "aria-live": "polite" });
    this.estimateSlot = new Slot();
    this.started = 0;
    this.timer = null;
    this.cancelled = false;
    this.form = el(
      "form",
      { class: "pane-form", onsubmit: (event) => (event.preventDefault(), this.run()) },
      el("div", { class: "field" }, el("label", { for: `${id}-method`, text: "Method" }), this.methodSelect, this.methodError),
      this.paramsBox,
      el("div", { class: "run-row" }, this.estimate, this.cancelButton, this.runButton),
    );
    this.form.addEventListener("change", (event) => {
      if (event.target === this.methodSelect) return;
      const changed = this.fields.find((f) => f.input === event.target);
      if (changed) writeState({ [`${this.id}.${changed.field.name}`]: controlText(changed.field, changed.input) });
      this.estimateCost();
    });
    this.base = el("canvas", { class: "base", "aria-hidden": "true" });
    this.heat = el("canvas", { class: "heat", "aria-hidden": "true" });
    this.bar = colourBar(`${id}-colorbar`);
    this.stack = el(
      "div",
      { class: "stack", role: "img", "aria-label": "No heatmap yet", "aria-describedby": `${id}-colorbar` },
      this.base,
      this.heat,
    );
    this.caption = el("figcaption", { class: "result", text: "Give an image to see where the model looks." });
    this.figure = el("figure", { class: "overlay" }, this.stack, this.bar, this.caption);
    this.drawn = null; // {height, width, scale} of the map on the canvas, for people and tests
    root.replaceChildren(
      el("div", { class: "pane-head" }, el("h3", { text: heading }), spinner(`${heading}: computing`)),
      this.form,
      this.figure,
    );
    this.busy = new Busy(root);
  }

  setMethods(methods, chosen) {
    this.methods = methods;
    this.methodSelect.replaceChildren(...methods.map((m) => el("option", { value: m.name, text: m.name })));
    this.setMethod(chosen);
  }

  setMethod(name) {
    const method = this.methods.find((m) => m.name === name) || this.methods[0];
    if (!method) return;
    if (this.method !== null && this.method !== method.name) clearPaneParams(this.id); // another method's settings
    this.method = method.name;
    this.methodSelect.value = method.name;
    this.root.dataset.method = method.name;
    clearError(this.methodError);
    this.fields = method.params.map((field) => {
      const id = `${this.id}-${field.name}`;
      const errorId = `${id}-error`;
      const input = inputFor(field, id, errorId);
      const error = el("p", { class: "error", id: errorId, role: "alert", hidden: true });
      const text = field.description.replace(new RegExp(`^${method.name}:\\s*`), "");
      const help = el("span", { class: "help", id: `${id}-help`, text });
      const box = el(
        "div",
        { class: `field field-${field.kind}` },
        el("label", { for: id, text: field.name }),
        input,
        help,
        error,
      );
      return { field, input, error, box };
    });
    this.paramsBox.replaceChildren(...this.fields.map((f) => f.box));
    const saved = paneParams(this.id); // a shared link's settings for this method
    for (const f of this.fields) {
      if (f.field.name in saved) setControl(f.field, f.input, saved[f.field.name]);
    }
    this.linkModes(method.name);
  }

  /**
   * Fields that belong to one choice of another field (feature_ablation's `slic: segments` beside `grid: cell`,
   * said in their descriptions as "<method> <choice>: ..."): shown, and sent, only while that choice is picked.
   */
  linkModes(methodName) {
    const pattern = new RegExp(`^${methodName}\\s+([a-z_]+):`);
    for (const f of this.fields) {
      const match = pattern.exec(f.field.description);
      const selector = match && this.fields.find((o) => o.field.kind === "enum" && (o.field.choices || []).includes(match[1]));
      f.mode = selector ? { selector, choice: match[1] } : null;
    }
    const update = () => {
      for (const f of this.fields) f.box.hidden = !this.isActive(f);
    };
    for (const selector of new Set(this.fields.filter((f) => f.mode).map((f) => f.mode.selector))) {
      selector.input.addEventListener("change", update);
    }
    update();
  }

  isActive(f) {
    return !f.mode || f.mode.selector.input.value === f.mode.choice;
  }

  clearErrors() {
    clearError(this.methodError);
    for (const f of this.fields) clearError(f.error);
  }

  /** The slot for a field name the API mentions: its field, the target picker, else the method picker. */
  slotFor(name) {
    if (name === "target") return this.app.targetError;
    const found = this.fields.find((f) => f.field.name === name);
    return found ? found.error : this.methodError;
  }

  /** Put each part of an API error next to the control it names (pydantic's loc, or a field named in the text). */
  placeError(error) {
    const detail = error.detail;
    if (Array.isArray(detail)) {
      const bySlot = new Map();
      for (const item of detail) {
        const loc = item && Array.isArray(item.loc) ? item.loc.map(String) : [];
        const name = loc.find((part) => part === "target" || part === "method" || this.fields.some((f) => f.field.name === part));
        const slot = this.slotFor(name);
        bySlot.set(slot, [...(bySlot.get(slot) || []), item]);
      }
      for (const [slot, items] of bySlot) showError(slot, { status: error.status, detail: items });
      return;
    }
    let name = null;
    if (typeof detail === "string") {
      const words = detail.toLowerCase();
      const byField = this.fields.find((f) => new RegExp(`(^|[^a-z_])${f.field.name}([^a-z_]|$)`).test(words));
      if (byField) name = byField.field.name;
      else if (/^(unknown )?target\b|\btarget (index|label)\b/.test(words)) name = "target";
    }
    showError(this.slotFor(name), error);
  }

  /** The request the form describes, or null without a model, an image or a method. */
  body() {
    const { model, input, target } = this.app.current();
    if (!model || !input || !this.method) return null;
    const body = { model, inputs: [{ image: input.b64 }], method: this.method, format: "safetensors" };
    if (target !== null) body.target = target;
    for (const f of this.fields) {
      if (!this.isActive(f)) continue; // another choice's field: sent, it would be refused
      const { field, input: control } = f;
      const value = readField(field, control);
      if (value !== undefined) body[field.name] = value;
    }
    return body;
  }

  /** Ask the API what the form's request would cost (dry_run: nothing runs) and say it next to Run. */
  async estimateCost() {
    const body = this.body();
    const signal = this.estimateSlot.next();
    if (!body) {
      this.estimate.textContent = "";
      return null;
    }
    try {
      const cost = await postJSON("saliency", { ...body, dry_run: true }, signal);
      if (this.timer === null) this.estimate.textContent = describeCost(cost);
      this.estimate.dataset.admitted = String(cost.admitted);
      return cost;
    } catch (error) {
      if (!isAbort(error) && this.timer === null) this.estimate.textContent = "";
      return null;
    }
  }

  cancel() {
    this.cancelled = true;
    this.slot.cancel();
  }

  startClock() {
    if (this.timer !== null) window.clearInterval(this.timer);
    this.started = performance.now();
    this.cancelButton.hidden = false;
    const tick = () => {
      this.estimate.textContent = `running ${((performance.now() - this.started) / 1000).toFixed(1)} s`;
    };
    tick();
    this.timer = window.setInterval(tick, 200);
  }

  stopClock() {
    if (this.timer !== null) window.clearInterval(this.timer);
    this.timer = null;
    this.cancelButton.hidden = true;
    return (performance.now() - this.started) / 1000;
  }

  async run() {
    const { input, preprocess } = this.app.current();
    const body = this.body();
    if (!body) return;
    this.clearErrors();
    const signal = this.slot.next();
    this.cancelled = false;
    this.root.dataset.state = "running";
    this.estimateCost();
    this.startClock();
    try {
      const buffer = await this.busy.run(() => postJSON("saliency", body, signal, "arrayBuffer"));
      const { metadata, tensors } = parseSafetensors(buffer);
      const answer = JSON.parse(metadata.response || "{}");
      const result = (answer.results || [])[0];
      const heatmap = tensors["0:heatmap"];
      if (!result || !heatmap) throw new Error("the answer has no heatmap");
      const map = drawnMap(tensors, result.tokens);
      const { height: h, width: w, scale } = map;
      drawModelView(this.base, input, preprocess, [h, w]);
      paintHeatmap(this.heat, map.values, h, w, scale, { overlay: true });
      setColourBar(this.bar, scale, { scope: map.scope, overlay: true, note: map.notes.join("; ") });
      this.drawn = { height: h, width: w, kind: scale.kind, lo: scale.lo, hi: scale.hi };
      this.stack.classList.toggle("pixelated", Math.max(h, w) < SMALL_INPUT);
      const label = result.label ?? String(result.target);
      const colours = scale.kind === "diverging" ? "red: positive attribution, blue: negative" : "bright: more attribution";
      this.stack.setAttribute("aria-label", `${this.method} heatmap for class ${label} over the input image (${colours})`);
      const parts = [`class ${label}`, `logit ${formatNumber(result.score)}`, `p ${formatNumber(result.probability, 3)}`];
      if (result.convergence_delta !== undefined && result.convergence_delta !== null) {
        parts.push(`convergence Δ ${formatNumber(result.convergence_delta, 3)}`);
      }
      this.caption.textContent = `${this.method}: ${parts.join(" · ")}`;
      this.root.dataset.state = "done";
      this.root.dataset.target = String(result.target);
      this.root.dataset.resultMethod = this.method;
      const seconds = this.stopClock();
      this.estimate.textContent = `took ${seconds.toFixed(seconds < 1 ? 2 : 1)} s`;
    } catch (error) {
      if (isAbort(error)) {
        if (this.cancelled) {  // the Cancel button, not a newer run replacing this one
          const seconds = this.stopClock();
          this.root.dataset.state = "cancelled";
          this.estimate.textContent = `cancelled after ${seconds.toFixed(1)} s`;
        }
        return;
      }
      this.stopClock();
      this.estimate.textContent = "";
      this.blank("");
      this.root.dataset.state = "error";
      if (error.status) this.placeError(error);
      else showError(this.methodError, error);
    }
  }

  clear() {
    this.slot.cancel();
    this.stopClock();
    this.estimate.textContent = "";
    this.root.dataset.state = "";
    this.blank("Give an image to see where the model looks.");
  }

  blank(caption) {
    for (const canvas of [this.base, this.heat]) {
      canvas.width = 1;
      canvas.height = 1;
    }
    this.stack.setAttribute("aria-label", "No heatmap");
    this.caption.textContent = caption;
    hideColourBar(this.bar);
    this.drawn = null;
  }
}
