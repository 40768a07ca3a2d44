// The page's only way to the server: the public HTTP API, by URLs relative to where /ui is served.

const BASE = new URL(".", document.baseURI);

/** An answer that was not 2xx: its status and the API's `detail`. */
export class ApiError extends Error {
  constructor(status, detail) {
    super(typeof detail === "string" ? detail : JSON.stringify(detail));
    this.status = status;
    this.detail = detail;
  }
}

export function apiUrl(path) {
  return new URL(path.replace(/^\//, ""), BASE).toString();
}

export function isAbort(error) {
  return error && error.name === "AbortError";
}

async function send(path, init, as) {
  let response;
  try {
    response = await fetch(apiUrl(path), init);
  } catch (error) {
    if (isAbort(error)) throw error;
    throw new ApiError(0, `the server did not answer (${error.message})`);
  }
  if (!response.ok) {
    let detail = response.statusText || "error";
    try {
      const body = await response.json();
      detail = body.detail ?? body.error ?? detail;
    } catch {
      // not JSON: keep the status text
    }
    throw new ApiError(response.status, detail);
  }
  if (as === "json") return response.json();
  if (as === "blob") return response.blob();
  return response.arrayBuffer();
}

export function getJSON(path, signal) {
  return send(path, { signal }, "json");
}

/** GET a binary answer (a .safetensors file) as an ArrayBuffer. */
export function getBuffer(path, signal) {
  return send(path, { signal }, "arrayBuffer");
}

/** POST a JSON body; `as` is "json", "blob" (PNG answers) or "arrayBuffer" (safetensors answers). */
export function postJSON(path, body, signal, as = "json") {
  const init = { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal };
  return send(path, init, as);
}

/** One AbortController per slot: starting a new request cancels that slot's previous one. */
export class Slot {
  constructor() {
    this.controller = null;
  }

  next() {
    if (this.controller) this.controller.abort();
    this.controller = new AbortController();
    return this.controller.signal;
  }

  cancel() {
    if (this.controller) this.controller.abort();
    this.controller = null;
  }
}
