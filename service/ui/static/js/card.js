// The model card: torchinfo's summary, the state dict with health statistics (NaN and Inf
// highlighted), the optimizer state when there is one, and print(model).

import { Slot, apiUrl, getBuffer, isAbort } from "./api.js";
import { el, formatNumber, formatShape } from "./dom.js";
import { fnmatchRegExp, hasWildcards } from "./fnmatch.js";
import { describeHistogram, drawHistogram } from "./histogram.js";
import { parseSafetensors } from "./safetensors.js";

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

const STATE_COLUMNS = [
  // [header, entry field it sorts by]
  ["key", "key"],
  ["kind", "kind"],
  ["shape", "numel"],
  ["dtype", "dtype"],
  ["min", "min"],
  ["max", "max"],
  ["mean", "mean"],
  ["std", "std"],
  ["norm", "norm"],
  ["NaN", "nan_count"],
  ["Inf", "inf_count"],
];

/** Keys matching a filter: an fnmatch pattern (`layer4.*`) where it has wildcards, else a substring. */
function keyFilter(text) {
  const pattern = text.trim();
  if (!pattern) return () => true;
  if (hasWildcards(pattern)) {
    const re = fnmatchRegExp(pattern);
    return (key) => re.test(key);
  }
  return (key) => key.includes(pattern);
}

function compare(a, b) {
  if (a === b) return 0;
  if (a === null || a === undefined) return 1; // missing statistics last, in either order
  if (b === null || b === undefined) return -1;
  return typeof a === "number" && typeof b === "number" ? a - b : String(a).localeCompare(String(b));
}

/**
 * The state dict as a table: filtered by key, sorted by any column (click its header), NaN and Inf
 * highlighted, each key a .npy download, and each floating-point tensor's histogram on demand.
 */
export function renderStateDict(box, model, data) {
  const unhealthy = data.entries.filter((e) => (e.nan_count || 0) + (e.inf_count || 0) > 0);
  const verdict = unhealthy.length
    ? el("p", { class: "verdict bad", role: "status", text: `${unhealthy.length} of ${data.num_tensors} tensors hold NaN or Inf values.` })
    : el("p", { class: "verdict good", text: `${data.num_tensors} tensors, ${formatNumber(data.total_numel)} numbers (${bytes(data.total_bytes)}); no NaN or Inf.` });
  const order = { field: null, descending: false };
  const heads = STATE_COLUMNS.map(([label, field]) =>
    el("th", { scope: "col", "aria-sort": "none", "data-sort": field }, el("button", { type: "button", class: "sort", text: label })),
  );
  const head = el("tr", {}, ...heads, el("th", { scope: "col", text: "values" }));
  const canvas = el("canvas", { id: "state-histogram-canvas", role: "img", "aria-label": "Histogram" });
  const caption = el("figcaption", { id: "state-histogram-caption" });
  const figure = el("figure", { class: "histogram", id: "state-histogram", hidden: true }, canvas, caption);
  const slot = new Slot();
  const showHistogram = async (entry) => {
    const path = `models/${encodeURIComponent(model)}/state-dict?key=${encodeURIComponent(entry.key)}&format=safetensors`;
    try {
      const { tensors } = parseSafetensors(await getBuffer(path, slot.next()));
      const values = tensors[entry.key].data;
      const found = drawHistogram(canvas, values, Math.max(240, Math.min(560, box.clientWidth - 24)));
      canvas.setAttribute("aria-label", `Histogram of ${entry.key}`);
      caption.textContent = `${entry.key} ${formatShape(entry.shape)}: ${describeHistogram(found, values.length)}`;
      figure.dataset.key = entry.key;
      figure.hidden = false;
    } catch (error) {
      if (isAbort(error)) return;
      caption.textContent = `${entry.key}: ${error.message}`;
      figure.hidden = false;
    }
  };
  const rows = data.entries.map((e) => {
    const bad = (e.nan_count || 0) + (e.inf_count || 0) > 0;
    const link = el("a", {
      href: apiUrl(`models/${encodeURIComponent(model)}/state-dict?key=${encodeURIComponent(e.key)}&format=npy`),
      download: `${e.key}.npy`,
      title: `Download ${e.key} as .npy`,
      text: e.key,
    });
    const floating = /^(float|bfloat)/.test(e.dtype);
    const button = floating
      ? el("button", { type: "button", class: "hist", text: "histogram", "aria-label": `Histogram of ${e.key}` })
      : el("span", { class: "meta", text: "–" });
    if (floating) button.addEventListener("click", () => showHistogram(e));
    const row = el(
      "tr",
      { class: bad ? "bad" : "", "data-key": e.key },
      el("th", { scope: "row" }, link),
      el("td", { text: e.kind }),
      el("td", { text: formatShape(e.shape) }),
      el("td", { text: e.dtype }),
      ...["min", "max", "mean", "std", "norm"].map((k) => el("td", { class: "num", text: formatNumber(e[k], 3) })),
      el("td", { class: `num${e.nan_count ? " flag" : ""}`, text: formatNumber(e.nan_count ?? 0) }),
      el("td", { class: `num${e.inf_count ? " flag" : ""}`, text: formatNumber(e.inf_count ?? 0) }),
      el("td", {}, button),
    );
    return { entry: e, row };
  });
  const body = el("tbody", {});
  const filter = el("input", {
    type: "search",
    id: "state-filter",
    placeholder: "filter keys: layer4.*, bias",
    "aria-label": "Filter the state dict by key (an fnmatch pattern, or text the key contains)",
    autocomplete: "off",
    spellcheck: false,
  });
  const count = el("span", { class: "meta", id: "state-count", "aria-live": "polite" });
  const apply = () => {
    const keep = keyFilter(filter.value);
    const shown = rows.filter(({ entry }) => keep(entry.key));
    if (order.field !== null) {
      const sign = order.descending ? -1 : 1;
      shown.sort((a, b) => sign * compare(a.entry[order.field], b.entry[order.field]));
    }
    body.replaceChildren(...shown.map(({ row }) => row));
    count.textContent = `${shown.length} of ${rows.length} tensors`;
  };
  for (const th of heads) {
    th.querySelector("button").addEventListener("click", () => {
      const field = th.dataset.sort;
      order.descending = order.field === field ? !order.descending : false;
      order.field = field;
      for (const other of heads) other.setAttribute("aria-sort", "none");
      th.setAttribute("aria-sort", order.descending ? "descending" : "ascending");
      apply();
    });
  }
  filter.addEventListener("input", apply);
  const table = el(
    "table",
    { class: "data state-dict" },
    el("caption", { class: "sr-only", text: "State dict entries with statistics" }),
    el("thead", {}, head),
    body,
  );
  apply();
  box.replaceChildren(
    verdict,
    el("div", { class: "inline-form state-tools" }, el("label", { for: "state-filter", text: "Filter keys" }), filter, count),
    el("div", { class: "scroll", tabindex: "0", role: "region", "aria-label": "State dict table" }, table),
    figure,
  );
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
