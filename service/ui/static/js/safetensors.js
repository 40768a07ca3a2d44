// Read a safetensors answer: 8-byte little-endian header length, a JSON header, then raw tensors.

function halfToFloat(h) {
  const sign = h & 0x8000 ? -1 : 1;
  const exponent = (h >> 10) & 0x1f;
  const fraction = h & 0x3ff;
  if (exponent === 0) return sign * 2 ** -14 * (fraction / 1024);
  if (exponent === 31) return fraction ? NaN : sign * Infinity;
  return sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
}

function decode(dtype, bytes) {
  const copy = bytes.slice().buffer; // aligned copy: typed arrays need an aligned offset
  if (dtype === "F32") return new Float32Array(copy);
  if (dtype === "F64") return Float32Array.from(new Float64Array(copy));
  if (dtype === "F16") return Float32Array.from(new Uint16Array(copy), halfToFloat);
  if (dtype === "BF16") {
    const words = new Uint16Array(copy);
    const out = new Uint32Array(words.length);
    for (let i = 0; i < words.length; i += 1) out[i] = words[i] << 16;
    return new Float32Array(out.buffer);
  }
  throw new Error(`unsupported safetensors dtype ${dtype}`);
}

/** `{metadata, tensors: {key: {shape, dtype, data: Float32Array}}}` from an ArrayBuffer. */
export function parseSafetensors(buffer) {
  const view = new DataView(buffer);
  const length = Number(view.getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buffer, 8, length)));
  const metadata = header.__metadata__ || {};
  delete header.__metadata__;
  const start = 8 + length;
  const tensors = {};
  for (const [key, info] of Object.entries(header)) {
    const [begin, end] = info.data_offsets;
    const bytes = new Uint8Array(buffer, start + begin, end - begin);
    tensors[key] = { shape: info.shape, dtype: info.dtype, data: decode(info.dtype, bytes) };
  }
  return { metadata, tensors };
}
