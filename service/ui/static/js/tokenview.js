// The token view of a vision transformer's layer whose output is `[N, T, D]`: each patch token's L2 norm as a map
// over the patch grid, the prefix tokens (cls, dist, reg0, ... as the API names them) as labelled cells beside it,
// and the D values of the selected token (click a cell, or arrow keys and Enter) as bars. The selected token is
// kept in the URL (`token`, counted from the start of the whole sequence as the API counts it).

import { barAt, drawBars } from "./bars.js";
import { colourBar, formatEnd, hideColourBar, setColourBar } from "./colorbar.js";
import { INFERNO, position, rangeOf, scaleOf } from "./colormap.js";
import { el, formatNumber, formatShape } from "./dom.js";
import { readState, writeState } from "./state.js";

/**
 * How a tensor of `shape` holds the tokens of `tokens` (the API's layout {count, prefix, grid}): {length, depth,
 * first} where `first` is the sequence index of its first row (0, or the number of prefix tokens when it holds the
 * patch tokens alone); null when it is no `[N, T, D]` token sequence of that layout.
 */
export function tokenSequence(shape, tokens) {
  if (!tokens || !Array.isArray(shape) || shape.length !== 3) return null;
  const [, length, depth] = shape;
  const patches = tokens.grid[0] * tokens.grid[1];
  if (length !== tokens.count && length !== patches) return null;
  return { length, depth, first: length === tokens.count ? 0 : tokens.count - patches };
}

/** The L2 norm of each of `length` rows of `depth` values (the first input's `[T, D]`), summed in double precision. */
export function tokenNorms(data, length, depth) {
  const norms = new Float64Array(length);
  for (let t = 0; t < length; t += 1) {
    let sum = 0;
    for (let d = 0; d < depth; d += 1) {
      const v = data[t * depth + d];
      sum += v * v;
    }
    norms[t] = Math.sqrt(sum);
  }
  return norms;
}

function colourOf(scale, value) {
  const k = Math.round(position(scale, value) * 255) * 3;
  return `rgb(${scale.lut[k]}, ${scale.lut[k + 1]}, ${scale.lut[k + 2]})`;
}

export class TokenView {
  constructor(root) {
    this.root = root;
    this.caption = root.querySelector("#token-caption");
    this.prefixBox = root.querySelector("#token-prefix");
    this.gridBox = root.querySelector("#token-grid");
    this.detail = root.querySelector("#token-detail");
    this.where = root.querySelector("#token-where");
    this.bars = root.querySelector("#token-bars");
    this.dim = root.querySelector("#token-dim");
    this.bar = colourBar("token-colorbar");
    root.querySelector("#token-map").after(this.bar);
    this.view = null; // {key, tokens, first, length, depth, values, norms}
    const { token } = readState();
    this.selected = token !== undefined && /^\d+$/.test(token) ? Number(token) : null;
    root.querySelector("#token-map").addEventListener("keydown", (event) => this.moveFocus(event));
    this.bars.addEventListener("click", (event) => {
      if (this.values) this.showDim(barAt(this.bars, event, this.values.length));
    });
    this.bars.addEventListener("keydown", (event) => this.stepDim(event));
  }

  hide() {
    this.view = null;
    this.values = null;
    this.root.hidden = true;
    hideColourBar(this.bar);
  }

  /** The tokens of `tensor` (an `[N, T, D]` capture `key`) for the first input, drawn with the layout `tokens`. */
  show(key, tensor, tokens) {
    const seq = tokenSequence(tensor.shape, tokens);
    if (!seq) {
      this.hide();
      return;
    }
    const { length, depth, first } = seq;
    const values = tensor.data.subarray(0, length * depth);
    const norms = tokenNorms(values, length, depth);
    this.view = { key, shape: tensor.shape, tokens, first, length, depth, values, norms };
    const scale = scaleOf(rangeOf(norms), INFERNO);
    const [rows, cols] = tokens.grid;
    const prefix = tokens.prefix.length;
    const cells = [];
    for (let t = 0; t < length; t += 1) {
      const index = first + t;
      const norm = norms[t];
      const attrs = {
        type: "button",
        "data-token": String(index),
        "data-norm": String(norm),
        "aria-pressed": "false",
        tabindex: "-1",
        onclick: () => this.select(index),
      };
      if (index < prefix) {
        const name = tokens.prefix[index];
        const label = `token ${index}, the ${name} token: L2 norm ${formatNumber(norm)}`;
        cells.push(
          el(
            "button",
            { ...attrs, class: "token-cell prefix", "data-name": name, "aria-label": label, title: label },
            el("span", { class: "swatch", style: `background: ${colourOf(scale, norm)}`, "aria-hidden": "true" }),
            el("span", { class: "name", text: name }),
            el("span", { class: "value", text: formatNumber(norm, 3) }),
          ),
        );
      } else {
        const patch = index - prefix;
        const row = Math.floor(patch / cols);
        const col = patch % cols;
        const label = `token ${index}, patch row ${row}, column ${col}: L2 norm ${formatNumber(norm)}`;
        cells.push(
          el("button", {
            ...attrs,
            class: "token-cell patch",
            "data-row": String(row),
            "data-col": String(col),
            "aria-label": label,
            title: label,
            style: `background: ${colourOf(scale, norm)}`,
          }),
        );
      }
    }
    this.prefixBox.replaceChildren(...cells.filter((c) => c.classList.contains("prefix")));
    this.prefixBox.hidden = this.prefixBox.childElementCount === 0;
    this.gridBox.style.setProperty("--cols", String(cols));
    this.gridBox.setAttribute("aria-label", `L2 norm of each of the ${rows}×${cols} patch tokens of ${key}`);
    this.gridBox.replaceChildren(...cells.filter((c) => c.classList.contains("patch")));
    setColourBar(this.bar, scale, {
      scope: `L2 norm of each token over its ${depth} values, all ${length} tokens on one scale`,
      note: "a cell's title gives its norm",
    });
    const prefixWords = first === 0 && prefix
      ? ` and ${prefix} prefix token${prefix === 1 ? "" : "s"} (${tokens.prefix.join(", ")}) beside it`
      : "";
    this.caption.textContent = `${key} ${formatShape(tensor.shape)}: the L2 norm of each token's ${depth} values over `
      + `the ${rows}×${cols} patch grid${prefixWords}. Click a token, or move with the arrow keys and press Enter, `
      + "to see its values.";
    this.root.hidden = false;
    if (this.selected !== null && (this.selected < first || this.selected >= first + length)) {
      this.selected = null;
      writeState({ token: null });
    }
    this.render();
  }

  /** Select token `index` (counted from the start of the sequence) and show its values. */
  select(index) {
    if (!this.view) return;
    const { first, length } = this.view;
    if (!Number.isInteger(index) || index < first || index >= first + length) return;
    this.selected = index;
    writeState({ token: String(index) });
    this.render();
  }

  cells() {
    return [...this.root.querySelectorAll(".token-cell")];
  }

  cell(index) {
    return this.root.querySelector(`.token-cell[data-token="${index}"]`);
  }

  /** Mark the selected cell, keep one cell in the tab order, and draw the selected token's bars. */
  render() {
    const { first, depth, values, norms, key } = this.view;
    const focusable = this.selected ?? first;
    for (const c of this.cells()) {
      const index = Number(c.dataset.token);
      c.setAttribute("aria-pressed", String(index === this.selected));
      c.tabIndex = index === focusable ? 0 : -1;
    }
    if (this.selected === null) {
      delete this.root.dataset.token;
      this.values = null;
      this.detail.hidden = true;
      return;
    }
    const t = this.selected - first;
    this.values = values.subarray(t * depth, (t + 1) * depth);
    this.root.dataset.token = String(this.selected);
    const width = Math.max(200, Math.min(640, this.root.clientWidth - 4));
    const { lo, hi } = drawBars(this.bars, this.values, width);
    this.bars.dataset.token = String(this.selected);
    this.bars.setAttribute("aria-label", `the ${depth} values of token ${this.selected} of ${key}, from ${formatEnd(lo)} to ${formatEnd(hi)}`);
    this.where.textContent = `${this.describe(this.selected)}: L2 norm ${formatNumber(norms[t])}; its ${depth} values `
      + `from ${formatEnd(lo)} to ${formatEnd(hi)} (blue above zero, red below). Click a bar, or use the arrow keys, for its value.`;
    this.dim.textContent = "";
    delete this.dim.dataset.dim;
    delete this.dim.dataset.value;
    delete this.bars.dataset.unit;
    this.detail.hidden = false;
  }

  /** A token in words: "token 30, the patch at row 3, column 5 of the 8×8 grid" or "token 0, the cls token". */
  describe(index) {
    const { tokens } = this.view;
    const prefix = tokens.prefix.length;
    if (index < prefix) return `Token ${index}, the ${tokens.prefix[index]} token (a prefix token, not on the patch grid)`;
    const [rows, cols] = tokens.grid;
    const patch = index - prefix;
    return `Token ${index}, the patch at row ${Math.floor(patch / cols)}, column ${patch % cols} of the ${rows}×${cols} grid`;
  }

  /** Arrow keys move the focus over the grid (left of column 0: the prefix tokens); Enter or Space selects. */
  moveFocus(event) {
    if (!this.view || !["ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight", "Home", "End"].includes(event.key)) return;
    const current = event.target.closest && event.target.closest(".token-cell");
    if (!current) return;
    event.preventDefault();
    const { tokens, first, length } = this.view;
    const prefix = tokens.prefix.length;
    const [rows, cols] = tokens.grid;
    const index = Number(current.dataset.token);
    let next = index;
    if (event.key === "Home") next = first;
    else if (event.key === "End") next = first + length - 1;
    else if (index < prefix) {
      if (event.key === "ArrowUp") next = Math.max(first, index - 1);
      else if (event.key === "ArrowDown") next = index + 1 < prefix ? index + 1 : index;
      else if (event.key === "ArrowRight") next = prefix + Math.min(rows - 1, index) * cols;
    } else {
      const patch = index - prefix;
      const row = Math.floor(patch / cols);
      const col = patch % cols;
      if (event.key === "ArrowLeft") next = col > 0 ? index - 1 : first < prefix ? Math.min(prefix - 1, row) : index;
      else if (event.key === "ArrowRight") next = col < cols - 1 ? index + 1 : index;
      else if (event.key === "ArrowUp") next = row > 0 ? index - cols : index;
      else if (event.key === "ArrowDown") next = row < rows - 1 ? index + cols : index;
    }
    const target = this.cell(next);
    if (!target) return;
    for (const c of this.cells()) c.tabIndex = c === target ? 0 : -1;
    target.focus();
  }

  stepDim(event) {
    if (!this.values || !["ArrowLeft", "ArrowRight"].includes(event.key)) return;
    event.preventDefault();
    const current = Number(this.bars.dataset.unit ?? -1);
    this.showDim(Math.max(0, Math.min(this.values.length - 1, current + (event.key === "ArrowRight" ? 1 : -1))));
  }

  showDim(index) {
    const value = this.values[index];
    this.bars.dataset.unit = String(index);
    this.dim.dataset.dim = String(index);
    this.dim.dataset.value = String(value);
    this.dim.textContent = `token ${this.selected}, dimension ${index}: ${formatNumber(value)}`;
  }

  /** For tests and people: the norms drawn now, by token index. */
  drawn() {
    if (!this.view) return null;
    const { first, norms } = this.view;
    return Object.fromEntries([...norms].map((n, t) => [first + t, n]));
  }
}
