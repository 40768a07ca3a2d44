// One saliency pane: a method picker, that method's parameters as form fields (from /openapi.json),
// and the heatmap over the image as the model sees it. The panel holds two panes side by side.

import { Slot, isAbort, postJSON } from "./api.js";
import { paintHeatmap } from "./colormap.js";
import { Busy, clearError, el, formatNumber, showError, spinner } from "./dom.js";
import { drawModelView } from "./image.js";
import { parseSafetensors } from "./safetensors.js";

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
    this.form = el(
      "form",
      { class: "pane-form", onsubmit: (event) => (event.preventDefault(), this.run()) },
      el("div", { class: "field" }, el("label", { for: `${id}-method`, text: "Method" }), this.methodSelect, this.methodError),
      this.paramsBox,
      el("button", { type: "submit", class: "run", text: "Run" }),
    );
    this.base = el("canvas", { class: "base", "aria-hidden": "true" });
    this.heat = el("canvas", { class: "heat", "aria-hidden": "true" });
    this.stack = el("div", { class: "stack", role: "img", "aria-label": "No heatmap yet" }, this.base, this.heat);
    this.caption = el("figcaption", { class: "result", text: "Give an image to see where the model looks." });
    this.figure = el("figure", { class: "overlay" }, this.stack, this.caption);
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

  async run() {
    const { model, input, preprocess, target } = this.app.current();
    if (!model || !input || !this.method) return;
    this.clearErrors();
    const body = { model, inputs: [{ image: input.b64 }], method: this.method, format: "safetensors" };
    if (target !== null) body.target = target;
    for (const { field, input: control } of this.fields) {
      const value = readField(field, control);
      if (value !== undefined) body[field.name] = value;
    }
    const signal = this.slot.next();
    this.root.dataset.state = "running";
    try {
      const buffer = await this.busy.run(() => postJSON("saliency", body, signal, "arrayBuffer"));
      const { metadata, tensors } = parseSafetensors(buffer);
      const answer = JSON.parse(metadata.response || "{}");
      const result = (answer.results || [])[0];
      const heatmap = tensors["0:heatmap"];
      if (!result || !heatmap) throw new Error("the answer has no heatmap");
      const [h, w] = heatmap.shape;
      drawModelView(this.base, input, preprocess, [h, w]);
      paintHeatmap(this.heat, heatmap.data, h, w);
      this.stack.classList.toggle("pixelated", Math.max(h, w) < SMALL_INPUT);
      const label = result.label ?? String(result.target);
      this.stack.setAttribute(
        "aria-label",
        `${this.method} heatmap for class ${label} over the input image (bright: more attribution)`,
      );
      const parts = [`class ${label}`, `logit ${formatNumber(result.score)}`, `p ${formatNumber(result.probability, 3)}`];
      if (result.convergence_delta !== undefined && result.convergence_delta !== null) {
        parts.push(`convergence Δ ${formatNumber(result.convergence_delta, 3)}`);
      }
      this.caption.textContent = `${this.method}: ${parts.join(" · ")}`;
      this.root.dataset.state = "done";
      this.root.dataset.target = String(result.target);
      this.root.dataset.resultMethod = this.method;
    } catch (error) {
      if (isAbort(error)) return;
      this.blank("");
      this.root.dataset.state = "error";
      if (error.status) this.placeError(error);
      else showError(this.methodError, error);
    }
  }

  clear() {
    this.slot.cancel();
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
  }
}
