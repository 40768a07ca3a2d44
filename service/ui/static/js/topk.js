// Top-k as a horizontal bar chart: label, a bar as long as the probability, the number.

import { el } from "./dom.js";

/** The change of a probability against `before` (null: the class is not in it), in percentage points. */
function change(score, before) {
  if (before === null || before === undefined) return { text: "new", cls: "delta new" };
  const points = (score - before) * 100;
  const text = `${points >= 0 ? "+" : "−"}${Math.abs(points).toFixed(Math.abs(points) >= 0.1 ? 1 : 3)}`;
  return { text, cls: `delta ${points > 0 ? "up" : points < 0 ? "down" : ""}` };
}

/**
 * Rows of `[{index, label, score}]` into `table` (a <table> with a caption). With `baseline` (another top-k of
 * the same input), a column says how each class's probability changed against it (Δ p, percentage points).
 */
export function renderTopK(table, topK, caption, baseline = null) {
  const before = baseline ? new Map(baseline.map((c) => [String(c.index), c.score])) : null;
  const body = el(
    "tbody",
    {},
    topK.map((c, rank) =>
      el(
        "tr",
        { "data-index": c.index, "data-label": c.label, "data-score": c.score, class: rank === 0 ? "top" : "" },
        el("th", { scope: "row", class: "label", title: `class ${c.index}`, text: c.label }),
        el(
          "td",
          { class: "bar-cell" },
          el("span", { class: "bar", style: `width: ${Math.max(0.5, c.score * 100).toFixed(2)}%`, "aria-hidden": "true" }),
        ),
        el("td", { class: "value", text: `${(c.score * 100).toFixed(c.score >= 0.001 ? 1 : 3)} %` }),
        ...(before ? [deltaCell(change(c.score, before.get(String(c.index))))] : []),
      ),
    ),
  );
  const heads = [el("th", { text: "class" }), el("th", { text: "bar" }), el("th", { text: "probability" })];
  if (before) heads.push(el("th", { text: "change (points)" }));
  table.replaceChildren(
    el("caption", { class: "sr-only", text: caption }),
    el("thead", { class: "sr-only" }, el("tr", {}, ...heads)),
    body,
  );
  table.hidden = false;
}

function deltaCell({ text, cls }) {
  return el("td", { class: cls, text, title: "change of the probability against the clean run, in percentage points" });
}
