// Small DOM helpers shared by the panels: element building, error slots and per-panel spinners.

/** Create an element with attributes (`class`, `text`, `on*` handlers, data-*, aria-*) and children. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key in node && !key.includes("-")) node[key] = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** The API's `detail` as one readable line: a string as is, pydantic's list as "loc: msg; ...". */
export function formatDetail(detail) {
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail)) {
    return detail
      .map((d) => (d && typeof d === "object" ? `${(d.loc || []).join(".")}: ${d.msg ?? JSON.stringify(d)}` : String(d)))
      .join("; ");
  }
  return JSON.stringify(detail);
}

/** Show an error in the slot beside the control that caused it (the slot is an aria-live region). */
export function showError(slot, error) {
  const status = error && error.status ? `${error.status}: ` : "";
  const detail = error !== null && typeof error === "object" && "detail" in error;  // a string is a message itself
  slot.textContent = status + (detail ? formatDetail(error.detail) : String(error));
  slot.hidden = false;
}

export function clearError(slot) {
  slot.textContent = "";
  slot.hidden = true;
}

/** Spinner and aria-busy for one panel while any of its requests runs. */
export class Busy {
  constructor(panel) {
    this.panel = panel;
    this.count = 0;
    this.spinner = panel.querySelector(":scope .spinner");
  }

  async run(task) {
    this.count += 1;
    this.update();
    try {
      return await task();
    } finally {
      this.count -= 1;
      this.update();
    }
  }

  update() {
    const busy = this.count > 0;
    this.panel.setAttribute("aria-busy", String(busy));
    if (this.spinner) this.spinner.hidden = !busy;
  }
}

/** A spinner element (hidden until its panel is busy). */
export function spinner(label) {
  return el("span", { class: "spinner", role: "status", hidden: true }, el("span", { class: "sr-only", text: label }));
}

export function formatNumber(value, digits = 4) {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value)) return value.toLocaleString("en-US");
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e5)) return value.toExponential(2);
  return value.toPrecision(digits).replace(/(\.\d*?)0+$/, "$1").replace(/\.$/, "");
}

export function formatShape(shape) {
  if (!Array.isArray(shape)) return "";
  if (shape.length && Array.isArray(shape[0])) return shape.map(formatShape).join(", ");
  return `[${shape.join(", ")}]`;
}

/** A cleared 2D context for `canvas` shown at width x height css px, drawn at the screen's pixel density. */
export function sharpContext(canvas, width, height) {
  const ratio = window.devicePixelRatio || 1;
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  return ctx;
}
