// Interventions, shown only when the server has POST /interventions: switch channels of the selected
// layer off (op "zero") and compare the clean and the edited top-k side by side.

import { Slot, isAbort, postJSON } from "./api.js";
import { clearError, el, showError } from "./dom.js";
import { renderTopK } from "./topk.js";

const MAX_TOGGLES = 256;

/** The clean and edited top-k of the first input in an answer, whatever nesting it uses. */
export function cleanAndEdited(answer) {
  const topOf = (node) => {
    if (!node) return null;
    if (Array.isArray(node)) return topOf(node[0]);
    if (Array.isArray(node.top_k)) return node.top_k;
    if (node.predictions) return topOf(node.predictions);
    return null;
  };
  const find = (node, key) => {
    if (!node || typeof node !== "object") return null;
    if (key in node) return node[key];
    for (const value of Object.values(node)) {
      const hit = find(value, key);
      if (hit) return hit;
    }
    return null;
  };
  return { clean: topOf(find(answer, "clean")), edited: topOf(find(answer, "edited")) };
}

function setPath(target, path, value) {
  let node = target;
  for (const key of path.slice(0, -1)) node = node[key] = node[key] || {};
  node[path[path.length - 1]] = value;
}

export class InterventionsPanel {
  constructor(panel, shape, busy, app) {
    this.panel = panel;
    this.shape = shape;
    this.busy = busy;
    this.app = app;
    this.slot = new Slot();
    this.site = panel.querySelector("#edit-site");
    this.toggles = panel.querySelector("#edit-channels");
    this.error = panel.querySelector("#edit-error");
    this.clean = panel.querySelector("#edit-clean");
    this.edited = panel.querySelector("#edit-edited");
    panel.querySelector("#edit-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.run();
    });
    panel.querySelector("#edit-all-on").addEventListener("click", () => this.setAll(true));
    panel.querySelector("#edit-all-off").addEventListener("click", () => this.setAll(false));
    panel.hidden = false;
  }

  /** The selected layer and how many channels its output has (from the layer view's statistics). */
  setLayer(name, channels) {
    this.layer = name;
    this.site.textContent = name === null ? "Pick a layer in the tree." : `${name || "(model)"} · ${channels} channels`;
    const count = Math.min(channels || 0, MAX_TOGGLES);
    this.toggles.replaceChildren(
      ...Array.from({ length: count }, (_, i) =>
        el("label", { class: "channel-toggle" }, el("input", { type: "checkbox", checked: true, value: String(i) }), ` ${i}`),
      ),
    );
  }

  setAll(on) {
    for (const box of this.toggles.querySelectorAll("input")) box.checked = on;
  }

  async run() {
    clearError(this.error);
    const { model, input } = this.app.current();
    if (!input || this.layer === null || this.layer === undefined) {
      showError(this.error, "give an image and pick a layer first");
      return;
    }
    const off = [...this.toggles.querySelectorAll("input")].filter((box) => !box.checked).map((box) => Number(box.value));
    if (!off.length) {
      showError(this.error, "switch at least one channel off");
      return;
    }
    const edit = { [this.shape.siteKey]: this.layer, op: "zero" };
    setPath(edit, this.shape.channelsPath, off);
    const body = { model, inputs: [{ image: input.b64 }], [this.shape.editsKey]: [edit] };
    const signal = this.slot.next();
    try {
      const answer = await this.busy.run(() => postJSON("interventions", body, signal));
      const { clean, edited } = cleanAndEdited(answer);
      if (clean) renderTopK(this.clean, clean, "Clean top-k");
      if (edited) renderTopK(this.edited, edited, `Top-k with channels ${off.join(", ")} of ${this.layer} zeroed`);
      this.panel.dataset.state = "done";
    } catch (error) {
      if (!isAbort(error)) showError(this.error, error);
    }
  }
}
