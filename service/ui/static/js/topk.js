// Top-k as a horizontal bar chart: label, a bar as long as the probability, the number.

import { el } from "./dom.js";

/** Rows of `[{index, label, score}]` into `table` (a <table> with a caption). */
export function renderTopK(table, topK, caption) {
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
      ),
    ),
  );
  table.replaceChildren(
    el("caption", { class: "sr-only", text: caption }),
    el("thead", { class: "sr-only" }, el("tr", {}, el("th", { text: "class" }), el("th", { text: "bar" }), el("th", { text: "probability" }))),
    body,
  );
  table.hidden = false;
}
