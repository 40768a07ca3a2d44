// The input image: from a file (picker or drop), a shipped sample, or the tab's last upload; drawn
// as the model sees it (the preprocessing INFO reports: resize the shorter side, centre crop).

const STORAGE_KEY = "hookserve.inspector.upload";
const STORAGE_LIMIT = 3_000_000; // characters of a data URL kept in sessionStorage

export function bytesToBase64(bytes) {
  let text = "";
  const chunk = 0x8000;
  for (let i = 0; i < bytes.length; i += chunk) text += String.fromCharCode(...bytes.subarray(i, i + chunk));
  return btoa(text);
}

async function decode(bytes, type) {
  const url = URL.createObjectURL(new Blob([bytes], { type: type || "application/octet-stream" }));
  try {
    const image = new Image();
    image.src = url;
    await image.decode();
    return image;
  } finally {
    URL.revokeObjectURL(url);
  }
}

/** `{name, bytes, b64, element, source}` for raw image bytes; `element` is null when the browser cannot decode them. */
export async function makeInput(name, bytes, type, source) {
  let element = null;
  try {
    element = await decode(bytes, type);
  } catch {
    element = null; // the server decides; it answers 400 with a detail for what it cannot read either
  }
  return { name, bytes, b64: bytesToBase64(bytes), element, source };
}

export async function fromFile(file) {
  const bytes = new Uint8Array(await file.arrayBuffer());
  const input = await makeInput(file.name, bytes, file.type, "upload");
  remember(input, file.type);
  return input;
}

export async function fromUrl(name, url, source) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: ${response.status}`);
  const bytes = new Uint8Array(await response.arrayBuffer());
  return makeInput(name, bytes, response.headers.get("content-type"), source);
}

function remember(input, type) {
  const dataUrl = `data:${type || "application/octet-stream"};base64,${input.b64}`;
  try {
    if (dataUrl.length <= STORAGE_LIMIT) sessionStorage.setItem(STORAGE_KEY, JSON.stringify({ name: input.name, dataUrl }));
    else sessionStorage.removeItem(STORAGE_KEY);
  } catch {
    // storage full or disabled: a reload then shows no image, nothing else changes
  }
}

export function forgetUpload() {
  try {
    sessionStorage.removeItem(STORAGE_KEY);
  } catch {
    // nothing stored
  }
}

/** This tab's last uploaded image (kept across reloads), or null. */
export async function restoreUpload() {
  let saved = null;
  try {
    saved = JSON.parse(sessionStorage.getItem(STORAGE_KEY) || "null");
  } catch {
    return null;
  }
  if (!saved || typeof saved.dataUrl !== "string") return null;
  const [head, b64] = saved.dataUrl.split(",", 2);
  const binary = atob(b64);
  const bytes = Uint8Array.from(binary, (c) => c.charCodeAt(0));
  return makeInput(saved.name, bytes, head.slice(5).split(";")[0], "upload");
}

/** Resize-then-crop geometry as the server's preprocessing does it, in source pixels. */
function viewGeometry(width, height, preprocess) {
  let scale = 1;
  if (preprocess && preprocess.resize) scale = preprocess.resize / Math.min(width, height);
  const scaledW = Math.round(width * scale);
  const scaledH = Math.round(height * scale);
  const crop = preprocess && preprocess.crop ? preprocess.crop : null;
  const outW = crop || scaledW;
  const outH = crop || scaledH;
  const left = (scaledW - outW) / 2;
  const top = (scaledH - outH) / 2;
  return { scale, outW, outH, left, top };
}

/** Draw `input` into `canvas` as the model sees it (size, crop, grayscale), at `size` [H, W] if given. */
export function drawModelView(canvas, input, preprocess, size) {
  const ctx = canvas.getContext("2d");
  if (!input || !input.element) {
    canvas.width = 1;
    canvas.height = 1;
    ctx.clearRect(0, 0, 1, 1);
    return;
  }
  const image = input.element;
  const g = viewGeometry(image.naturalWidth, image.naturalHeight, preprocess);
  canvas.width = size ? size[1] : g.outW;
  canvas.height = size ? size[0] : g.outH;
  const fx = canvas.width / g.outW;
  const fy = canvas.height / g.outH;
  ctx.fillStyle = "#000";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.imageSmoothingEnabled = true;
  ctx.imageSmoothingQuality = "high";
  ctx.drawImage(image, -g.left * fx, -g.top * fy, image.naturalWidth * g.scale * fx, image.naturalHeight * g.scale * fy);
  if (preprocess && preprocess.grayscale) {
    const pixels = ctx.getImageData(0, 0, canvas.width, canvas.height);
    const d = pixels.data;
    for (let i = 0; i < d.length; i += 4) {
      const luma = Math.round((d[i] * 299 + d[i + 1] * 587 + d[i + 2] * 114) / 1000);
      d[i] = luma;
      d[i + 1] = luma;
      d[i + 2] = luma;
    }
    ctx.putImageData(pixels, 0, 0);
  }
}
