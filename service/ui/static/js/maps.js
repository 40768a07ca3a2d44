// Tensors as the maps the inspector draws: a vision transformer's tokens as maps over its patch grid, and an
// attribution of several channels as one signed map.

/**
 * One input's `[T, D]` tokens as `[D, rows, cols]` maps over the patch grid (prefix tokens left out), as the API's
 * PNG grid draws them (service/introspection/tokens.py, row_grid); null when `shape` is not such a sequence.
 * `tokens` is a layout as the API reports it: {count, prefix, grid}.
 */
export function tokenGrid(data, shape, tokens) {
  if (!tokens || shape.length !== 2) return null;
  const [rows, cols] = tokens.grid;
  const patches = rows * cols;
  const [length, depth] = shape;
  if (length !== tokens.count && length !== patches) return null;
  const start = length - patches;
  const out = new Float32Array(depth * patches);
  for (let p = 0; p < patches; p += 1) {
    for (let d = 0; d < depth; d += 1) out[d * patches + p] = data[(start + p) * depth + d];
  }
  return { data: out, shape: [depth, rows, cols] };
}

/**
 * One input's attribution as a single `[h, w]` map with its sign: for `[..., h, w]` at each pixel the value of the
 * channel with the largest |attribution| (its magnitude is the API's heatmap before min–max scaling); `[h, w]` as it
 * is; `[L]` as `[1, L]`. `tokens`: the answer's token layout, for a layer attribution over a ViT's tokens.
 * Returns {values, h, w, planes} or null for a scalar.
 */
export function signedMap(attribution, tokens = null) {
  if (!attribution || !attribution.shape.length) return null;
  let { data, shape } = attribution;
  const [rows, cols] = tokens ? tokens.grid : [0, 0];
  if (tokens && shape.length === 2 && !(shape[0] === rows && shape[1] === cols)) {
    const grid = tokenGrid(data, shape, tokens);
    if (grid) ({ data, shape } = grid);
  }
  if (shape.length === 1) return { values: data, h: 1, w: shape[0], planes: 1 };
  const h = shape[shape.length - 2];
  const w = shape[shape.length - 1];
  const size = h * w;
  const planes = size ? data.length / size : 0;
  if (planes <= 1) return { values: data, h, w, planes: 1 };
  const values = new Float32Array(size);
  for (let i = 0; i < size; i += 1) {
    let best = 0;
    for (let c = 0; c < planes; c += 1) {
      const v = data[c * size + i];
      if (Math.abs(v) > Math.abs(best)) best = v;
    }
    values[i] = best;
  }
  return { values, h, w, planes };
}
