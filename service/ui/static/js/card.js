// The model card: torchinfo's summary, the state dict with health statistics (NaN and Inf
// highlighted), the optimizer state when there is one, and print(model).

import { apiUrl } from "./api.js";
import { el, formatNumber, formatShape } from "./dom.js";

const TOTALS = [
  ["total_params", "parameters"],
  ["trainable_params", "trainable"],
  ["non_trainable_params", "non-trainable"],
  ["total_mult_adds", "mult-adds"],
  ["input_size_mb", "input (MB)"],
  ["forward_backward_pass_size_mb", "forward/backward pass (MB)"],
  ["params_size_mb", "parameters (MB)"],
  ["estimated_total_size_mb", "estimated total (MB)"],
];

export function renderSummary(box, summary) {
  const totals = el(
    "dl",
    { class: "totals" },
    TOTALS.filter(([key]) => summary[key] !== undefined).map(([key, label]) => [
      el("dt", { text: label }),
      el("dd", { text: formatNumber(summary[key]) }),
    ]),
  );
  box.replaceChildren(totals, el("pre", { class: "summary-text", tabindex: "0", text: summary.text || "" }));
}

function bytes(n) {
  if (n >= 1 << 20) return `${(n / (1 << 20)).toFixed(1)} MiB`;
  if (n >= 1 << 10) return `${(n / (1 << 10)).toFixed(1)} KiB`;
  return `${n} B`;
}

export function renderStateDict(box, model, data) {
  const unhealthy = data.entries.filter((e) => (e.nan_count || 0) + (e.inf_count || 0) > 0);
  const verdict = unhealthy.length
    ? el("p", { class: "verdict bad", role: "status", text: `${unhealthy.length} of ${data.num_tensors} tensors hold NaN or Inf values.` })
    : el("p", { class: "verdict good", text: `${data.num_tensors} tensors, ${formatNumber(data.total_numel)} numbers (${bytes(data.total_bytes)}); no NaN or Inf.` });
  const head = el(
    "tr",
    {},
    ["key", "kind", "shape", "dtype", "min", "max", "mean", "std", "norm", "NaN", "Inf"].map((h) =>
      el("th", { scope: "col", text: h }),
    ),
  );
  const rows = data.entries.map((e) => {
    const bad = (e.nan_count || 0) + (e.inf_count || 0) > 0;
    const link = el("a", {
      href: apiUrl(`models/${encodeURIComponent(model)}/state-dict?key=${encodeURIComponent(e.key)}&format=npy`),
      download: `${e.key}.npy`,
      title: `Download ${e.key} as .npy`,
      text: e.key,
    });
    return el(
      "tr",
      { class: bad ? "bad" : "", "data-key": e.key },
      el("th", { scope: "row" }, link),
      el("td", { text: e.kind }),
      el("td", { text: formatShape(e.shape) }),
      el("td", { text: e.dtype }),
      ...["min", "max", "mean", "std", "norm"].map((k) => el("td", { class: "num", text: formatNumber(e[k], 3) })),
      el("td", { class: `num${e.nan_count ? " flag" : ""}`, text: formatNumber(e.nan_count ?? 0) }),
      el("td", { class: `num${e.inf_count ? " flag" : ""}`, text: formatNumber(e.inf_count ?? 0) }),
    );
  });
  const table = el(
    "table",
    { class: "data state-dict" },
    el("caption", { class: "sr-only", text: "State dict entries with statistics" }),
    el("thead", {}, head),
    el("tbody", {}, rows),
  );
  box.replaceChildren(verdict, el("div", { class: "scroll", tabindex: "0", role: "region", "aria-label": "State dict table" }, table));
}

function describeEntry(value) {
  if (value && typeof value === "object" && "shape" in value) return `${formatShape(value.shape)} ${value.dtype || ""}`.trim();
  return formatNumber(value);
}

export function renderOptimizer(box, data) {
  const groups = data.param_groups.map((group, i) => {
    const hyper = Object.entries(group).filter(([key]) => key !== "params" && key !== "param_names");
    return el(
      "div",
      { class: "group" },
      el("h4", { text: `${data.type || "optimizer"} · group ${i} · ${group.params.length} parameters` }),
      el(
        "dl",
        { class: "totals" },
        hyper.map(([key, value]) => [el("dt", { text: key }), el("dd", { text: Array.isArray(value) ? value.join(", ") : formatNumber(value) })]),
      ),
    );
  });
  const rows = data.state.map((s) =>
    el(
      "tr",
      {},
      el("th", { scope: "row", text: s.param_name ?? String(s.param) }),
      el("td", { text: Object.entries(s.entries).map(([k, v]) => `${k}: ${describeEntry(v)}`).join("; ") }),
    ),
  );
  const state = rows.length
    ? el(
        "div",
        { class: "scroll", tabindex: "0", role: "region", "aria-label": "Optimizer state table" },
        el(
          "table",
          { class: "data" },
          el("caption", { class: "sr-only", text: "Optimizer state per parameter" }),
          el("thead", {}, el("tr", {}, el("th", { scope: "col", text: "parameter" }), el("th", { scope: "col", text: "state" }))),
          el("tbody", {}, rows),
        ),
      )
    : el("p", { text: "No per-parameter state yet (the optimizer has not stepped)." });
  box.replaceChildren(...groups, state);
}
