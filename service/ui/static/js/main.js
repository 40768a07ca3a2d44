// The inspector: wires the panels to the public API and keeps the view (model, sample, layer,
// filter, methods, target, attention block, head and query) in the URL.

import { ApiError, Slot, getJSON, isAbort, postJSON } from "./api.js";
import { AttentionPanel } from "./attention.js";
import { renderOptimizer, renderStateDict, renderSummary } from "./card.js";
import { renderGraph } from "./graph.js";
import { Busy, clearError, el, formatNumber, formatShape, showError } from "./dom.js";
import { bytesToBase64, drawModelView, forgetUpload, fromFile, fromUrl, restoreUpload } from "./image.js";
import { InterventionsPanel } from "./interventions.js";
import { LayerView, tileCount } from "./layerview.js";
import { SaliencyPane } from "./saliency.js";
import { defaultMethod, interventionsShape, saliencyMethods } from "./schema.js";
import { readState, writeState } from "./state.js";
import { renderTopK } from "./topk.js";
import { LayerTree } from "./tree.js";

const $ = (selector) => document.querySelector(selector);
const MAX_SUMMARY_DEPTH = 16;
const POLL_MS = 1000;
const ROOT_TOKEN = "(model)"; // the root module's name is ""; in the URL it is spelled this way

class Inspector {
  constructor() {
    this.state = readState();
    this.models = [];
    this.samples = {};
    this.model = null;
    this.info = null;
    this.input = null;
    this.predictions = null;
    this.pendingTarget = null; // a target from the URL, chosen once the top-k it belongs to is known
    this.modelSlot = new Slot();
    this.predictSlot = new Slot();
    this.filterSlot = new Slot();
    this.cardSlot = new Slot();
    this.graphSlot = new Slot();
    this.graphLoaded = null; // the model whose graph is drawn
    this.busy = {
      info: new Busy($("#info-panel")),
      predict: new Busy($("#predict-panel")),
      layers: new Busy($("#layers-panel")),
      layer: new Busy($("#layer-view")),
      card: new Busy($("#card-panel")),
    };
    this.targetError = $("#target-error");
    this.tree = new LayerTree($("#tree-body"), (name) => this.selectLayer(name));
    this.layerView = new LayerView($("#layer-view"), this.busy.layer, (name, call, shape) => {
      if (this.interventions && name === this.tree.selected) this.interventions.setLayer(name, tileCount(shape), call);
    });
    const app = { current: () => this.current(), targetError: this.targetError };
    this.panes = [
      new SaliencyPane($("#pane-a"), "a", "Left", app, (m) => writeState({ method: m })),
      new SaliencyPane($("#pane-b"), "b", "Right", app, (m) => writeState({ method2: m })),
    ];
    this.interventions = null;
    this.attention = new AttentionPanel($("#attention-panel"), new Busy($("#attention-panel")), app, this.state);
  }

  current() {
    const value = $("#target").value;
    const target = value === "" ? null : /^-?\d+$/.test(value) ? Number(value) : value;
    return { model: this.model, input: this.input, preprocess: this.info && this.info.preprocess, target };
  }

  async start() {
    this.bind();
    let openapi;
    try {
      [openapi, this.models] = await Promise.all([getJSON("openapi.json"), getJSON("models").then((r) => r.models)]);
    } catch (error) {
      showError($("#model-error"), error);
      return;
    }
    this.samples = await getJSON("ui/samples").catch(() => ({}));
    const methods = saliencyMethods(openapi);
    const first = defaultMethod(openapi, methods);
    const second = (methods.find((m) => m.name === "gradcam") || methods.find((m) => m.name !== first) || {}).name;
    this.panes[0].setMethods(methods, this.state.method || first);
    this.panes[1].setMethods(methods, this.state.method2 || second || first);
    const shape = interventionsShape(openapi);
    if (shape) this.interventions = new InterventionsPanel($("#interventions-panel"), shape, new Busy($("#interventions-panel")), { current: () => this.current() });
    $("#model").replaceChildren(
      ...this.models.map((m) => el("option", { value: m.name, text: m.status === "ready" ? m.name : `${m.name} (${m.status})` })),
    );
    const wanted = this.models.find((m) => m.name === this.state.model);
    const ready = this.models.find((m) => m.status === "ready");
    const chosen = (wanted || ready || this.models[0] || {}).name;
    if (!chosen) {
      showError($("#model-error"), "the server serves no model");
      return;
    }
    if (this.state.target) this.pendingTarget = this.state.target;
    if (this.state.filter) $("#filter").value = this.state.filter;
    await this.selectModel(chosen, true);
    if (this.state.model && !wanted) {
      showError($("#model-error"), `this link's model '${this.state.model}' is not served here; showing ${chosen} (GET /models lists them)`);
    }
  }

  /** The model's graph, fetched when its section is first opened for this model. */
  async loadGraph() {
    const name = this.model;
    if (!name || this.graphLoaded === name) return;
    this.graphLoaded = name;
    clearError($("#graph-error"));
    $("#graph-status").textContent = "Tracing the model…";
    try {
      const answer = await getJSON(`models/${encodeURIComponent(name)}/nodes`, this.graphSlot.next());
      if (this.model !== name) return;
      renderGraph($("#graph-box"), answer.nodes, (layer) => {
        if (this.tree.has(layer)) this.selectLayer(layer);
      });
      const merges = $("#graph-box").querySelectorAll(".graph-row.merge").length;
      $("#graph-status").textContent = `${answer.nodes.length} nodes at input ${formatShape(answer.input_size)}; `
        + `${merges} take several inputs (residual adds, concatenations). Click a module's row to show that layer.`;
    } catch (error) {
      if (isAbort(error)) return;
      this.graphLoaded = null;
      $("#graph-status").textContent = "";
      $("#graph-box").replaceChildren();
      showError($("#graph-error"), error);
    }
  }

  bind() {
    $("#graph-details").addEventListener("toggle", () => {
      if ($("#graph-details").open) this.loadGraph();
    });
    $("#model").addEventListener("change", () => this.selectModel($("#model").value, false));
    $("#file").addEventListener("change", () => {
      const file = $("#file").files[0];
      if (file) this.useFile(file);
    });
    const drop = $("#drop");
    drop.addEventListener("dragover", (event) => {
      event.preventDefault();
      drop.classList.add("over");
    });
    drop.addEventListener("dragleave", () => drop.classList.remove("over"));
    drop.addEventListener("drop", (event) => {
      event.preventDefault();
      drop.classList.remove("over");
      const file = event.dataTransfer && event.dataTransfer.files[0];
      if (file) this.useFile(file);
    });
    for (const type of ["dragover", "drop"]) window.addEventListener(type, (event) => event.preventDefault());
    if (this.state.topk) $("#topk").value = this.state.topk;
    $("#topk-form").addEventListener("submit", (event) => {
      event.preventDefault();
      writeState({ topk: $("#topk").value === "5" ? null : $("#topk").value });
      this.predict();
    });
    $("#filter-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.applyFilter($("#filter").value.trim());
    });
    $("#filter-clear").addEventListener("click", () => {
      $("#filter").value = "";
      this.applyFilter("");
    });
    $("#target").addEventListener("change", () => {
      clearError(this.targetError);
      writeState({ target: $("#target").value });
      for (const pane of this.panes) pane.run();
      this.attention.runRelevance();
    });
    const opacity = $("#opacity");
    const setOpacity = () => $("#saliency-panel").style.setProperty("--heat-opacity", String(opacity.value / 100));
    if (this.state.opacity) opacity.value = this.state.opacity;
    opacity.addEventListener("input", setOpacity);
    opacity.addEventListener("change", () => writeState({ opacity: opacity.value }));
    setOpacity();
  }

  // ---- model -------------------------------------------------------------------------------

  async selectModel(name, restoring) {
    const signal = this.modelSlot.next();
    this.model = name;
    $("#model").value = name;
    clearError($("#model-error"));
    writeState({ model: name });
    if (!restoring) {
      this.pendingTarget = null;
      writeState({ target: null });
    }
    let info;
    try {
      info = await this.busy.info.run(() => this.waitReady(name, signal));
    } catch (error) {
      if (!isAbort(error)) showError($("#model-error"), error);
      return;
    }
    this.info = info;
    const option = [...$("#model").options].find((o) => o.value === name);
    if (option) option.textContent = name; // it may have been listed as "(loading)"
    this.renderInfo(info);
    this.showClassPanels(info);
    this.attention.setModel(info);
    this.layerView.tokens = info.attention ? info.attention.tokens : null;
    this.renderSamples();
    this.predictions = null;
    this.resetTargets();
    const urlLayer = this.state.layer === ROOT_TOKEN ? "" : this.state.layer;
    const layerName = restoring ? urlLayer : this.tree.selected;
    await this.loadStructure(name, info, signal);
    if (signal.aborted) return;
    if (restoring) {
      if (this.state.sample && this.samples[name]) await this.useSample(this.state.sample, false);
      else if (!this.input) {
        const upload = await restoreUpload().catch(() => null);
        if (upload) this.setInput(upload, false);
        else if (this.state.input === "upload") {
          showError($("#input-error"), "this link was made with an uploaded image, which stays in the browser that chose it: choose the image again or drop it here");
        }
      }
    }
    const filter = $("#filter").value.trim();
    if (filter) this.applyFilter(filter);
    if (layerName !== null && layerName !== undefined && this.tree.has(layerName)) this.tree.select(layerName);
    else {
      this.clearLayer();
      if (restoring && urlLayer) showError($("#layer-error"), `this link's layer '${urlLayer}' is not a layer of ${name}; pick one in the tree`);
    }
    this.runAll();
  }

  /** INFO once the model is ready; polls while it loads, fails with its error when it failed. */
  async waitReady(name, signal) {
    for (;;) {
      const info = await getJSON(`models/${encodeURIComponent(name)}`, signal);
      if (info.status === "ready") return info;
      if (info.status === "failed") throw new ApiError(409, `model ${name} failed to load: ${info.error || "unknown error"}`);
      this.renderInfo(info);
      await new Promise((resolve, reject) => {
        const timer = setTimeout(resolve, POLL_MS);
        signal.addEventListener("abort", () => {
          clearTimeout(timer);
          reject(new DOMException("aborted", "AbortError"));
        });
      });
    }
  }

  renderInfo(info) {
    const p = info.preprocess;
    const preprocess = p
      ? [
          p.resize ? `resize ${p.resize}` : null,
          p.crop ? `crop ${p.crop}` : null,
          p.interpolation,
          `mean ${p.mean.map((v) => formatNumber(v, 3)).join(", ")}`,
          `std ${p.std.map((v) => formatNumber(v, 3)).join(", ")}`,
          p.grayscale ? "grayscale" : null,
        ]
          .filter(Boolean)
          .join(" · ")
      : "–";
    const rows = [
      ["status", info.status],
      ["architecture", `${info.source}: ${info.architecture}`],
      ["device", info.device || "–"],
      ["dtype", `${info.dtype}${info.memory_format ? ` · ${info.memory_format}` : ""}`],
      ["parameters", `${formatNumber(info.num_parameters)} (${formatNumber(info.trainable_parameters)} trainable)`],
      ["weights", info.weights],
      ["input size", info.input_size ? formatShape(info.input_size) : "–"],
      ["preprocessing", preprocess],
      ["classes", `${info.num_classes ?? "–"}${info.labels ? " (labelled)" : ""}`],
      ["optimizer", info.optimizer || "none"],
    ];
    $("#info").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })]));
  }

  renderSamples() {
    const samples = this.samples[this.model] || [];
    $("#samples").hidden = samples.length === 0;
    $("#sample-list").replaceChildren(
      ...samples.map((s) =>
        el(
          "button",
          {
            type: "button",
            class: "sample",
            "data-sample": s.name,
            "aria-pressed": String(this.input && this.input.source === `sample:${s.name}`),
            title: `Sample digit ${s.label}`,
            onclick: () => this.useSample(s.name, true),
          },
          el("img", { src: s.url, alt: `digit ${s.label}`, width: 32, height: 32 }),
        ),
      ),
    );
  }

  async loadStructure(name, info, signal) {
    const model = encodeURIComponent(name);
    clearError($("#filter-error"));
    let layers;
    try {
      layers = await this.busy.layers.run(() => getJSON(`models/${model}/layers`, signal));
    } catch (error) {
      if (!isAbort(error)) showError($("#filter-error"), error);
      return;
    }
    this.tree.setLayers(layers.layers, null);
    this.graphLoaded = null;
    $("#graph-box").replaceChildren();
    $("#graph-status").textContent = "";
    if ($("#graph-details").open) this.loadGraph();
    const depth = Math.min(MAX_SUMMARY_DEPTH, Math.max(1, ...layers.layers.map((l) => l.depth)));
    this.loadCard(name, info, depth);
  }

  async loadCard(name, info, depth) {
    const signal = this.cardSlot.next();
    const model = encodeURIComponent(name);
    for (const id of ["#summary-error", "#state-error", "#optimizer-error"]) clearError($(id));
    $("#summary-box").replaceChildren();
    $("#state-box").replaceChildren();
    $("#optimizer-box").replaceChildren();
    $("#repr").textContent = info.repr || "";
    $("#card-optimizer").hidden = !info.optimizer;
    const summary = this.busy.card
      .run(() => getJSON(`models/${model}/summary?depth=${depth}`, signal))
      .then((data) => {
        this.tree.setShapes(data.rows);
        renderSummary($("#summary-box"), data);
        if (this.tree.selected !== null) this.refreshLayerMeta(); // the shapes arrived after the layer was shown
      })
      .catch((error) => isAbort(error) || showError($("#summary-error"), error));
    const stateDict = this.busy.card
      .run(() => getJSON(`models/${model}/state-dict?stats=true`, signal))
      .then((data) => renderStateDict($("#state-box"), name, data))
      .catch((error) => isAbort(error) || showError($("#state-error"), error));
    const optimizer = info.optimizer
      ? this.busy.card
          .run(() => getJSON(`models/${model}/optimizer`, signal))
          .then((data) => renderOptimizer($("#optimizer-box"), data))
          .catch((error) => isAbort(error) || showError($("#optimizer-error"), error))
      : Promise.resolve();
    await Promise.all([summary, stateDict, optimizer]);
  }

  refreshLayerMeta() {
    const name = this.tree.selected;
    const layer = this.tree.layer(name);
    if (!layer) return;
    const shape = this.tree.shape(name);
    const meta = $("#layer-meta");
    meta.textContent = `${layer.type} · ${formatNumber(layer.num_parameters)} parameters${shape ? ` · output ${formatShape(shape)}` : ""}`;
    if (this.interventions) this.interventions.setLayer(name, tileCount(shape));
  }

  // ---- input -------------------------------------------------------------------------------

  async useFile(file) {
    clearError($("#input-error"));
    try {
      const input = await fromFile(file);
      writeState({ sample: null, input: "upload" });
      this.setInput(input, true);
    } catch (error) {
      showError($("#input-error"), error);
    }
  }

  async useSample(name, run) {
    clearError($("#input-error"));
    const sample = (this.samples[this.model] || []).find((s) => s.name === name);
    if (!sample) return;
    try {
      const input = await fromUrl(`${name}.png`, sample.url, `sample:${name}`);
      forgetUpload();
      writeState({ sample: name, input: null });
      this.setInput(input, run);
    } catch (error) {
      showError($("#input-error"), error);
    }
  }

  setInput(input, run) {
    this.input = input;
    $("#file").value = "";
    for (const button of document.querySelectorAll(".sample")) {
      button.setAttribute("aria-pressed", String(input.source === `sample:${button.dataset.sample}`));
    }
    this.drawPreview();
    if (run) {
      this.resetTargets();
      this.runAll();
    }
  }

  drawPreview() {
    const figure = $("#preview-figure");
    if (!this.input) {
      figure.hidden = true;
      return;
    }
    const canvas = $("#preview");
    drawModelView(canvas, this.input, this.info && this.info.preprocess, null);
    canvas.classList.toggle("pixelated", canvas.width < 96);
    const size = `${canvas.width}×${canvas.height}`;
    canvas.setAttribute("aria-label", `${this.input.name} as ${this.model} sees it (${size})`);
    $("#preview-caption").textContent = this.input.element
      ? `${this.input.name} · as the model sees it, ${size}`
      : `${this.input.name} · the browser cannot show this file; the server decides`;
    figure.hidden = false;
  }

  // ---- prediction and targets --------------------------------------------------------------

  /** Everything that depends on the model and the image: preview, layer view, prediction, both panes. */
  runAll() {
    this.drawPreview();
    if (this.tree.selected !== null) this.selectLayer(this.tree.selected, false);
    if (!this.input) {
      for (const pane of this.panes) pane.clear();
      this.attention.clear();
      return;
    }
    if (this.hasClassScores()) {
      this.predict();
      for (const pane of this.panes) pane.run();
    }
    this.attention.run();
  }

  /** Whether the model answers class scores (INFO's num_classes): prediction, saliency and interventions need them. */
  hasClassScores() {
    return Boolean(this.info) && this.info.num_classes !== null && this.info.num_classes !== undefined;
  }

  /**
   * A model without class scores (a feature extractor such as efficientvit_b0 served features_only) gets the
   * panels that apply; the prediction, saliency and interventions panels say why they are off instead of
   * sending requests the API would refuse.
   */
  showClassPanels(info) {
    const on = this.hasClassScores();
    const why = `${info.name} gives no class scores (INFO's num_classes is not set: its forward returns features), so `
      + "there is nothing to predict, attribute to a class or compare; its layers, activations and model card apply.";
    for (const id of ["#predict-panel", "#saliency-panel", "#interventions-panel"]) {
      const panel = $(id);
      const note = panel.querySelector(":scope > .no-classes");
      note.textContent = on ? "" : why;
      note.hidden = on;
      panel.dataset.classScores = String(on);
    }
    if (!on) {
      for (const pane of this.panes) pane.clear();
      $("#topk-table").hidden = true;
      $("#predict-hint").hidden = true;
      clearError($("#predict-error"));
    }
  }

  /** Where an API error belongs: the image (400, 413), the model (404, 409), else `fallback`. */
  errorSlot(error, fallback) {
    if (error.status === 400 || error.status === 413) return $("#input-error");
    if (error.status === 404 || error.status === 409) return $("#model-error");
    return fallback;
  }

  async predict() {
    if (!this.input || !this.hasClassScores()) return;
    const signal = this.predictSlot.next();
    clearError($("#predict-error"));
    clearError($("#input-error"));
    const topK = Number($("#topk").value) || 5;
    $("#predict-hint").hidden = true;
    try {
      const answer = await this.busy.predict.run(() =>
        postJSON("predict", { model: this.model, inputs: [{ image: this.input.b64 }], top_k: topK }, signal),
      );
      this.predictions = answer.predictions[0].top_k;
      $("#predict-hint").hidden = true;
      renderTopK($("#topk-table"), this.predictions, `Top ${topK} classes for ${this.input.name}`);
      $("#predict-panel").dataset.state = "done";
      this.fillTargets();
    } catch (error) {
      if (isAbort(error)) return;
      $("#topk-table").hidden = true;
      showError(this.errorSlot(error, $("#predict-error")), error);
    }
  }

  resetTargets() {
    const select = $("#target");
    const keep = this.pendingTarget ?? (select.value || null);
    select.replaceChildren(el("option", { value: "", text: "top-1" }));
    if (keep !== null && keep !== "") {
      select.append(el("option", { value: keep, text: `class ${keep}` }));
      select.value = keep;
    }
  }

  fillTargets() {
    const select = $("#target");
    const keep = this.pendingTarget ?? select.value;
    this.pendingTarget = null;
    const options = [el("option", { value: "", text: "top-1" })];
    for (const c of this.predictions) {
      options.push(el("option", { value: String(c.index), text: `${c.label} · ${(c.score * 100).toFixed(1)} %` }));
    }
    if (keep && !this.predictions.some((c) => String(c.index) === keep)) {
      options.push(el("option", { value: keep, text: `class ${keep}` }));
    }
    select.replaceChildren(...options);
    select.value = keep || "";
  }

  // ---- layers ------------------------------------------------------------------------------

  selectLayer(name, scroll = true) {
    const layer = this.tree.layer(name);
    if (!layer) return;
    this.tree.select(name, { scroll });
    writeState({ layer: name === "" ? ROOT_TOKEN : name });
    const shape = this.tree.shape(name);
    this.layerView.show(this.model, layer, shape, this.input);
    if (this.interventions) this.interventions.setLayer(name, tileCount(shape));
  }

  clearLayer() {
    this.tree.selected = null;
    this.tree.render();
    writeState({ layer: null });
    this.layerView.clear();
    if (this.interventions) this.interventions.setLayer(null, 0);
  }

  /** Filter the tree by an fnmatch pattern, and ask the API to resolve it so its 422 detail shows. */
  async applyFilter(pattern) {
    clearError($("#filter-error"));
    writeState({ filter: pattern });
    const count = this.tree.filter(pattern || null);
    const status = $("#filter-status");
    if (!pattern) {
      this.filterSlot.cancel();
      status.textContent = "";
      return;
    }
    status.textContent = `${count} layer${count === 1 ? "" : "s"} match`;
    const inputs = this.validationInputs();
    if (!inputs) return;
    const signal = this.filterSlot.next();
    try {
      await this.busy.layers.run(() =>
        postJSON("activations", { model: this.model, inputs, layers: [pattern], format: "stats", reduce: "mean" }, signal),
      );
    } catch (error) {
      if (isAbort(error)) return;
      status.textContent = "";
      showError(error.status === 422 ? $("#filter-error") : this.errorSlot(error, $("#filter-error")), error);
    }
  }

  /** The current image, else a zero tensor of the model's input size: the API resolves patterns on a forward. */
  validationInputs() {
    if (this.input) return [{ image: this.input.b64 }];
    const size = this.info && this.info.input_size;
    if (!size) return null;
    const numel = size.reduce((a, b) => a * b, 1);
    return [{ tensor: { shape: size, dtype: "float32", b64: bytesToBase64(new Uint8Array(numel * 4)) } }];
  }
}

const inspector = new Inspector();
window.hookserveInspector = inspector;
inspector.start();
