// The layer tree: /layers (names, types, parameters, children) joined with /summary's output shapes;
// collapsible, filterable by an fnmatch pattern, one layer selected at a time.

import { el, formatNumber, formatShape } from "./dom.js";
import { matchLayers } from "./fnmatch.js";

function parentOf(name) {
  if (name === "") return null;
  const dot = name.lastIndexOf(".");
  return dot < 0 ? "" : name.slice(0, dot);
}

export class LayerTree {
  constructor(container, onSelect) {
    this.container = container;
    this.onSelect = onSelect;
    this.layers = [];
    this.byName = new Map();
    this.shapes = new Map();
    this.expanded = new Set([""]);
    this.selected = null;
    this.matched = null;
  }

  /** New model: its layers and (when the summary answered) the output shape per layer. */
  setLayers(layers, summaryRows) {
    this.layers = layers;
    this.byName = new Map(layers.map((layer) => [layer.name, layer]));
    this.shapes = new Map((summaryRows || []).map((row) => [row.name, row.output_shape]));
    this.expanded = new Set(layers.filter((layer) => layer.depth === 0).map((layer) => layer.name));
    this.selected = null;
    this.matched = null;
    this.render();
  }

  setShapes(summaryRows) {
    this.shapes = new Map((summaryRows || []).map((row) => [row.name, row.output_shape]));
    this.render();
  }

  names() {
    return this.layers.map((layer) => layer.name);
  }

  has(name) {
    return this.byName.has(name);
  }

  layer(name) {
    return this.byName.get(name) || null;
  }

  shape(name) {
    return this.shapes.get(name) || null;
  }

  /** Show only the layers `pattern` picks (and their ancestors, greyed); null shows every layer. */
  filter(pattern) {
    if (!pattern) {
      this.matched = null;
    } else {
      this.matched = new Set(matchLayers(this.names(), pattern));
      for (const name of this.matched) this.expandTo(name);
    }
    this.render();
    return this.matched ? this.matched.size : this.layers.length;
  }

  expandTo(name) {
    for (let p = parentOf(name); p !== null; p = parentOf(p)) this.expanded.add(p);
  }

  select(name, { scroll = true } = {}) {
    this.selected = name;
    this.expandTo(name);
    this.render();
    const row = this.container.querySelector(`[data-layer="${CSS.escape(name)}"]`);
    if (row && scroll) row.scrollIntoView({ block: "nearest" });
  }

  visible() {
    if (!this.matched) return null;
    const keep = new Set();
    for (const name of this.matched) {
      for (let n = name; n !== null; n = parentOf(n)) keep.add(n);
    }
    return keep;
  }

  render() {
    const keep = this.visible();
    const list = el("ul", { class: "tree-list", "aria-label": "Layers of the model" });
    const walk = (name, parentList) => {
      const layer = this.byName.get(name);
      if (!layer || (keep && !keep.has(name))) return;
      parentList.append(this.row(layer, keep));
      if (layer.children.length && this.expanded.has(name)) {
        for (const child of layer.children) walk(child, parentList);
      }
    };
    const roots = this.layers.filter((layer) => parentOf(layer.name) === null || !this.byName.has(parentOf(layer.name)));
    for (const root of roots) walk(root.name, list);
    this.container.replaceChildren(list);
  }

  row(layer, keep) {
    const name = layer.name;
    const label = name === "" ? "(model)" : name;
    const open = this.expanded.has(name);
    const hasChildren = layer.children.some((child) => !keep || keep.has(child));
    const toggle = hasChildren
      ? el("button", {
          type: "button",
          class: "toggle",
          "aria-expanded": String(open),
          "aria-label": `${open ? "Collapse" : "Expand"} ${label}`,
          text: open ? "▾" : "▸",
          onclick: () => {
            if (open) this.expanded.delete(name);
            else this.expanded.add(name);
            this.render();
            const again = this.container.querySelector(`[data-layer="${CSS.escape(name)}"] .toggle`);
            if (again) again.focus();
          },
        })
      : el("span", { class: "toggle-space", "aria-hidden": "true" });
    const shape = this.shapes.get(name);
    const context = this.matched && !this.matched.has(name);
    const pick = el(
      "button",
      {
        type: "button",
        class: "pick",
        "aria-pressed": String(this.selected === name),
        title: `${label}: ${layer.type}, ${formatNumber(layer.num_parameters)} parameters`,
        onclick: () => this.onSelect(name),
      },
      el("span", { class: "name", text: label }),
      el("span", { class: "type", text: layer.type }),
      el("span", { class: "shape", text: shape ? formatShape(shape) : "" }),
      el("span", { class: "params", text: layer.num_parameters ? formatNumber(layer.num_parameters) : "–" }),
    );
    return el(
      "li",
      {
        class: `tree-row${context ? " context" : ""}${this.selected === name ? " selected" : ""}`,
        "data-layer": name,
        style: `--depth: ${layer.depth}`,
      },
      toggle,
      pick,
    );
  }
}
