// The view in the URL (model, sample or that an upload was used, layer, filter, methods and each pane's method
// parameters, target, opacity, top-k, enlarged channel, the feature maps' scale, attention block, head and query,
// the token view's selected token),
// so a link restores it.

const KEYS = [
  "model", "sample", "input", "layer", "filter", "method", "method2", "target", "block", "head", "query",
  "opacity", "topk", "channel", "call", "scale", "token",
];
const PANE_PARAM = /^[ab]\.[A-Za-z_][A-Za-z0-9_]*$/; // a saliency pane's method parameter: `a.steps`, `b.window`

export function readState() {
  const params = new URLSearchParams(window.location.search);
  const state = {};
  for (const [key, value] of params) {
    if (KEYS.includes(key) || PANE_PARAM.test(key)) state[key] = value;
  }
  return state;
}

/** A pane's method parameters in the URL (`a.steps=512` -> {steps: "512"}). */
export function paneParams(pane) {
  const out = {};
  for (const [key, value] of new URLSearchParams(window.location.search)) {
    if (PANE_PARAM.test(key) && key.startsWith(`${pane}.`)) out[key.slice(2)] = value;
  }
  return out;
}

/** Remove every method parameter of a pane from the URL (its method changed). */
export function clearPaneParams(pane) {
  const params = new URLSearchParams(window.location.search);
  for (const key of [...params.keys()]) {
    if (PANE_PARAM.test(key) && key.startsWith(`${pane}.`)) params.delete(key);
  }
  const query = params.toString();
  window.history.replaceState(null, "", query ? `?${query}` : window.location.pathname);
}

/** Merge `changes` into the query string (null or "" removes a key) without adding history entries. */
export function writeState(changes) {
  const params = new URLSearchParams(window.location.search);
  for (const [key, value] of Object.entries(changes)) {
    if (value === null || value === undefined || value === "") params.delete(key);
    else params.set(key, String(value));
  }
  const query = params.toString();
  window.history.replaceState(null, "", query ? `?${query}` : window.location.pathname);
}
