// Interventions, shown only when the server has POST /interventions: switch channels of the selected
// layer off (op "zero") and compare the clean and the edited top-k side by side.

import { Slot, isAbort, postJSON } from "./api.js";
import { clearError, el, formatNumber, showError } from "./dom.js";
import { renderTopK } from "./topk.js";

/** Channel numbers from "0-15, 300": ranges inclusive; throws on anything else or past `count`. */
export function parseChannels(text, count) {
  const out = new Set();
  for (const part of text.split(",").map((p) => p.trim()).filter(Boolean)) {
    const match = /^(\d+)(?:\s*-\s*(\d+))?$/.exec(part);
    if (!match) throw new Error(`'${part}' is not a channel or a range (0-15)`);
    const [first, last] = [Number(match[1]), Number(match[2] ?? match[1])];
    if (last < first) throw new Error(`'${part}' runs backwards`);
    if (last >= count) throw new Error(`channel ${last} is past the layer's last, ${count - 1}`);
    for (let i = first; i <= last; i += 1) out.add(i);
  }
  return [...out];
}

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
    this.sweepSlot = new Slot();
    this.sweepTable = panel.querySelector("#sweep-table");
    this.sweepStatus = panel.querySelector("#sweep-status");
    this.sweepError = panel.querySelector("#sweep-error");
    panel.querySelector("#sweep-run").addEventListener("click", () => this.sweep());
    this.offText = panel.querySelector("#edit-off");
    panel.querySelector("#edit-off-apply").addEventListener("click", () => this.switchOff());
    this.offText.addEventListener("keydown", (event) => {
      if (event.key === "Enter") {
        event.preventDefault();
        this.switchOff();
      }
    });
    panel.hidden = false;
  }

  /** The selected layer and how many channels its output has (from the layer view's statistics). */
  /** The selected layer, its call (a module run several times has one output per call) and its channels. */
  setLayer(name, channels, call = 1) {
    if (name === this.layer && call === this.call && (channels || 0) === this.count) return; // boxes as they were
    this.layer = name;
    this.call = call;
    const which = call > 1 ? ` · call ${call}` : "";
    this.site.textContent = name === null ? "Pick a layer in the tree." : `${name || "(model)"}${which} · ${channels} channels`;
    const count = channels || 0; // every channel, however wide the layer (the box scrolls)
    this.count = count;
    this.sweepSlot.cancel();
    this.sweepTable.hidden = true;
    this.sweepStatus.textContent = "";
    clearError(this.sweepError);
    this.toggles.replaceChildren(
      ...Array.from({ length: count }, (_, i) =>
        el("label", { class: "channel-toggle" }, el("input", { type: "checkbox", checked: true, value: String(i) }), ` ${i}`),
      ),
    );
  }

  setAll(on) {
    for (const box of this.toggles.querySelectorAll("input")) box.checked = on;
  }

  /**
   * Ablate each channel of the layer in turn (POST /interventions/sweep) and list them by how much the target's
   * logit changed, the most needed first; "switch off" unticks one for the edit.
   */
  async sweep() {
    clearError(this.sweepError);
    const { model, input, target } = this.app.current();
    if (!input || this.layer === null || this.layer === undefined) {
      showError(this.sweepError, "give an image and pick a layer first");
      return;
    }
    const body = { model, inputs: [{ image: input.b64 }], site: this.layer };
    if (this.call > 1) body.call = this.call;
    if (target !== null) body.target = target;
    const signal = this.sweepSlot.next();
    const layer = this.layer;
    this.sweepStatus.textContent = `ablating the ${this.count} channels of ${layer || "(model)"} one at a time…`;
    try {
      const answer = await this.busy.run(() => postJSON("interventions/sweep", body, signal));
      this.renderSweep(answer, layer);
    } catch (error) {
      if (isAbort(error)) return;
      this.sweepStatus.textContent = "";
      showError(this.sweepError, error);
    }
  }

  renderSweep(answer, layer) {
    const effects = answer.channels;
    const widest = Math.max(1e-12, ...effects.map((e) => Math.abs(e.delta)));
    const rows = effects.map((e, rank) => {
      const off = el("button", { type: "button", class: "sweep-off", text: "switch off", "aria-label": `Switch channel ${e.channel} off` });
      off.addEventListener("click", () => {
        const box = this.toggles.querySelectorAll("input")[e.channel];
        if (box) box.checked = false;
      });
      const share = (Math.abs(e.delta) / widest) * 100;
      const bar = el("span", { class: `effect ${e.delta < 0 ? "down" : "up"}`, style: `width: ${share.toFixed(1)}%` });
      return el(
        "tr",
        { "data-channel": e.channel, "data-delta": e.delta },
        el("td", { class: "num", text: String(rank + 1) }),
        el("th", { scope: "row", text: `channel ${e.channel}` }),
        el("td", { class: "num", text: formatNumber(e.delta, 3) }),
        el("td", { class: "effect-cell" }, bar),
        el("td", {}, off),
      );
    });
    const head = el(
      "tr",
      {},
      ["rank", "channel", "Δ logit", "effect", ""].map((h) => el("th", { scope: "col", text: h })),
    );
    this.sweepTable.replaceChildren(
      el("caption", { class: "sr-only", text: `Channels of ${layer} by their effect on the target's logit` }),
      el("thead", {}, head),
      el("tbody", {}, rows),
    );
    this.sweepTable.hidden = false;
    const first = effects[0];
    const target = answer.targets && answer.targets.length ? ` ${answer.targets[0]}` : "";
    this.sweepStatus.textContent = first
      ? `${effects.length} channels of ${layer || "(model)"} zeroed one at a time, ranked by the change of class${target}'s `
        + `logit; the most needed: channel ${first.channel} (Δ ${formatNumber(first.delta, 3)})`
      : "no channels to sweep";
  }

  /** Untick the channels typed in the "switch off" field (ranges such as 0-15, 300). */
  switchOff() {
    clearError(this.error);
    let off;
    try {
      off = parseChannels(this.offText.value, this.count || 0);
    } catch (error) {
      showError(this.error, error.message);
      return;
    }
    const boxes = this.toggles.querySelectorAll("input");
    for (const i of off) boxes[i].checked = false;
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
    if (this.call > 1) edit.call = this.call;
    setPath(edit, this.shape.channelsPath, off);
    const body = { model, inputs: [{ image: input.b64 }], [this.shape.editsKey]: [edit] };
    const signal = this.slot.next();
    try {
      const answer = await this.busy.run(() => postJSON("interventions", body, signal));
      const { clean, edited } = cleanAndEdited(answer);
      if (clean) renderTopK(this.clean, clean, "Clean top-k");
      if (edited) {
        const caption = `Top-k with channels ${off.join(", ")} of ${this.layer} zeroed`;
        renderTopK(this.edited, edited, caption, clean);
      }
      this.panel.dataset.state = "done";
    } catch (error) {
      if (!isAbort(error)) showError(this.error, error);
    }
  }
}
