// The view in the URL (model, sample, layer, filter, methods, target, attention block, head and query), so a
// link restores it.

const KEYS = ["model", "sample", "layer", "filter", "method", "method2", "target", "block", "head", "query"];

export function readState() {
  const params = new URLSearchParams(window.location.search);
  const state = {};
  for (const key of KEYS) {
    if (params.has(key)) state[key] = params.get(key);
  }
  return state;
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
