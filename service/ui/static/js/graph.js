// The model's graph from /models/{name}/nodes (torch.fx nodes in execution order): one row per node, its
// edges drawn as arcs in a gutter on the left so skip connections (residual adds) show as long arcs beside
// the short ones. A row that runs a module picks that layer in the tree.

import { el, formatShape } from "./dom.js";

const ROW = 22; // px per node row
const LANE = 7; // px between arcs of different lanes
const EDGE_X = 6; // px: where every arc meets its rows
const SVG_NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  return node;
}

/** Edges [from, to] (row indices, from < to) with a lane each: overlapping long arcs get different lanes. */
export function layoutEdges(nodes) {
  const index = new Map(nodes.map((n, i) => [n.name, i]));
  const edges = [];
  nodes.forEach((node, to) => {
    for (const input of node.inputs) {
      const from = index.get(input);
      if (from !== undefined && from < to) edges.push({ from, to });
    }
  });
  const lanes = []; // per lane, the rows it is busy until
  for (const edge of [...edges].sort((a, b) => a.to - a.from - (b.to - b.from) || a.from - b.from)) {
    if (edge.to - edge.from === 1) {
      edge.lane = 0;
      continue;
    }
    let lane = 1;
    while (lanes[lane] !== undefined && lanes[lane].some(([a, b]) => edge.from < b && a < edge.to)) lane += 1;
    (lanes[lane] = lanes[lane] || []).push([edge.from, edge.to]);
    edge.lane = lane;
  }
  return edges;
}

/** What a node does, in a few words: the module's type, the function or method called, or its role. */
function describe(node) {
  if (node.op === "placeholder") return "input";
  if (node.op === "output") return "output";
  if (node.op === "call_module") return node.module_type;
  return node.target.replace(/^<built-in (function|method) (\w+)>$/, "$2").replace(/^_?operator\./, "");
}

export function renderGraph(box, nodes, onPick) {
  const edges = layoutEdges(nodes);
  const lanes = Math.max(1, ...edges.map((e) => e.lane));
  const gutter = EDGE_X + lanes * LANE + 6;
  const height = nodes.length * ROW;
  const arcs = svg("svg", { class: "graph-edges", width: gutter, height, "aria-hidden": "true" });
  const y = (i) => i * ROW + ROW / 2;
  for (const { from, to, lane } of edges) {
    const x = EDGE_X + lane * LANE;
    const d = lane === 0
      ? `M ${gutter} ${y(from)} H ${EDGE_X} V ${y(to)} H ${gutter}`
      : `M ${gutter} ${y(from)} H ${x + 4} Q ${x} ${y(from)} ${x} ${y(from) + 4} V ${y(to) - 4} Q ${x} ${y(to)} ${x + 4} ${y(to)} H ${gutter}`;
    arcs.append(svg("path", { class: `edge${lane ? " skip" : ""}`, d, "data-from": nodes[from].name, "data-to": nodes[to].name }));
  }
  const rows = nodes.map((node) => {
    const merge = node.inputs.filter((i) => nodes.some((n) => n.name === i)).length > 1;
    const pickable = node.op === "call_module";
    const attrs = {
      class: `graph-row op-${node.op}${merge ? " merge" : ""}`,
      "data-node": node.name,
      title: `${node.name}: ${node.op} ${node.target}${node.inputs.length ? ` ← ${node.inputs.join(", ")}` : ""}`,
    };
    const cells = [
      el("span", { class: "node-name", text: node.name }),
      el("span", { class: "node-op", text: describe(node) }),
      el("span", { class: "node-shape", text: Array.isArray(node.shape) && typeof node.shape[0] === "number" ? formatShape(node.shape) : "" }),
    ];
    if (!pickable) return el("div", attrs, ...cells);
    const button = el("button", { type: "button", class: "graph-pick", "aria-label": `Show layer ${node.module}` }, ...cells);
    button.addEventListener("click", () => onPick(node.module));
    return el("div", attrs, button);
  });
  const list = el("div", { class: "graph-rows", style: `margin-left: ${gutter}px` }, ...rows);
  box.replaceChildren(el("div", { class: "graph-canvas", style: `height: ${height}px` }, arcs, list));
  box.dataset.nodes = String(nodes.length);
  box.dataset.edges = String(edges.length);
}
