// The inspector's colour maps: matplotlib's "inferno" for non-negative maps (as the server's PNG heatmaps colour
// them), a blue-white-red diverging map for signed ones (symmetric about 0), and gray for feature-map grids.

// "inferno" sampled at 256 points, as service/codecs/colormap.py has it; tests/browser/test_static.py checks the
// two stay equal.
const HEX =
  "00000401000501010601010802010a02020c02020e03021004031204031405041706041907051b08051d09061f0a0722" +
  "0b07240c08260d08290e092b10092d110a30120a32140b34150b37160b39180c3c190c3e1b0c411c0c431e0c451f0c48" +
  "210c4a230c4c240c4f260c51280b53290b552b0b572d0b592f0a5b310a5c320a5e340a5f3609613809623909633b0964" +
  "3d09653e0966400a67420a68440a68450a69470b6a490b6a4a0c6b4c0c6b4d0d6c4f0d6c510e6c520e6d540f6d550f6d" +
  "57106e59106e5a116e5c126e5d126e5f136e61136e62146e64156e65156e67166e69166e6a176e6c186e6d186e6f196e" +
  "71196e721a6e741a6e751b6e771c6d781c6d7a1d6d7c1d6d7d1e6d7f1e6c801f6c82206c84206b85216b87216b88226a" +
  "8a226a8c23698d23698f24699025689225689326679526679727669827669a28659b29649d29649f2a63a02a63a22b62" +
  "a32c61a52c60a62d60a82e5fa92e5eab2f5ead305dae305cb0315bb1325ab3325ab43359b63458b73557b93556ba3655" +
  "bc3754bd3853bf3952c03a51c13a50c33b4fc43c4ec63d4dc73e4cc83f4bca404acb4149cc4248ce4347cf4446d04545" +
  "d24644d34743d44842d54a41d74b3fd84c3ed94d3dda4e3cdb503bdd513ade5238df5337e05536e15635e25734e35933" +
  "e45a31e55c30e65d2fe75e2ee8602de9612bea632aeb6429eb6628ec6726ed6925ee6a24ef6c23ef6e21f06f20f1711f" +
  "f1731df2741cf3761bf37819f47918f57b17f57d15f67e14f68013f78212f78410f8850ff8870ef8890cf98b0bf98c0a" +
  "f98e09fa9008fa9207fa9407fb9606fb9706fb9906fb9b06fb9d07fc9f07fca108fca309fca50afca60cfca80dfcaa0f" +
  "fcac11fcae12fcb014fcb216fcb418fbb61afbb81dfbba1ffbbc21fbbe23fac026fac228fac42afac62df9c72ff9c932" +
  "f9cb35f8cd37f8cf3af7d13df7d340f6d543f6d746f5d949f5db4cf4dd4ff4df53f4e156f3e35af3e55df2e661f2e865" +
  "f2ea69f1ec6df1ed71f1ef75f1f179f2f27df2f482f3f586f3f68af4f88ef5f992f6fa96f8fb9af9fc9dfafda1fcffa4";

/** The lookup table: 256 [r, g, b] byte triples, index = round(value * 255). */
export const INFERNO = Uint8Array.from(HEX.match(/../g), (h) => parseInt(h, 16));

/** ColorBrewer's RdBu, reversed: blue below zero, near-white at zero, red above (11 stops, evenly spaced). */
const RDBU = ["053061", "2166ac", "4393c3", "92c5de", "d1e5f0", "f7f7f7", "fddbc7", "f4a582", "d6604d", "b2182b", "67001f"];

/** A 256-entry [r, g, b] table through evenly spaced hex stops. */
function ramp(stops) {
  const rgb = stops.map((hex) => [0, 2, 4].map((i) => parseInt(hex.slice(i, i + 2), 16)));
  const table = new Uint8Array(256 * 3);
  for (let k = 0; k < 256; k += 1) {
    const at = (k / 255) * (rgb.length - 1);
    const i = Math.min(rgb.length - 2, Math.floor(at));
    const f = at - i;
    for (let c = 0; c < 3; c += 1) table[k * 3 + c] = Math.round(rgb[i][c] + (rgb[i + 1][c] - rgb[i][c]) * f);
  }
  return table;
}

/** The diverging table for signed values: index 0 = -max|v|, 127.5 = 0, 255 = +max|v|. */
export const DIVERGING = ramp(RDBU);

/** Black to white, the feature-map grid's sequential table (as the API's PNG grid draws it). */
export const GRAY = ramp(["000000", "ffffff"]);

/** Lowest and highest finite value of `values` ({lo: 0, hi: 0} when none is finite). */
export function rangeOf(values) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) {
    if (!Number.isFinite(v)) continue;
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  return lo === Infinity ? { lo: 0, hi: 0 } : { lo, hi };
}

/**
 * How to colour values ranging over [lo, hi]: signed data (any value below 0) gets the diverging table, symmetric
 * about 0 (ends ±max|v|); non-negative data the sequential table `lut` from lo to hi (min–max).
 */
export function scaleOf({ lo, hi }, lut = INFERNO) {
  if (lo < 0) {
    const m = Math.max(-lo, Math.abs(hi));
    return { kind: "diverging", lo: -m, hi: m, lut: DIVERGING };
  }
  return { kind: "sequential", lo, hi, lut };
}

/** `scaleOf` the range of `values`. */
export function scaleFor(values, lut = INFERNO) {
  return scaleOf(rangeOf(values), lut);
}

/** Where `v` falls on `scale`, in [0, 1] (the middle of a flat diverging scale, the bottom of a flat sequential one). */
export function position(scale, v) {
  const span = scale.hi - scale.lo;
  if (!Number.isFinite(v)) return scale.kind === "diverging" ? 0.5 : 0;
  if (!(span > 0)) return scale.kind === "diverging" ? 0.5 : 0;
  return Math.min(1, Math.max(0, (v - scale.lo) / span));
}

/** How strongly `v` shows over an image, in [0, 1]: |v| / max|v| on a diverging scale, its position otherwise. */
export function strength(scale, v) {
  const t = position(scale, v);
  return scale.kind === "diverging" ? Math.abs(t - 0.5) * 2 : t;
}

/**
 * Paint `values` (a [height, width] map) into `canvas` through `scale` (by default values in [0, 1] through inferno,
 * as the API's heatmap is). `overlay`: over an image, each pixel's opacity grows with its strength, so the image
 * shows through where the map is low (zero on a diverging scale is fully transparent); otherwise fully opaque.
 */
export function paintHeatmap(canvas, values, height, width, scale = null, { overlay = false } = {}) {
  const drawn = scale || { kind: "sequential", lo: 0, hi: 1, lut: INFERNO };
  canvas.width = width;
  canvas.height = height;
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(width, height);
  for (let i = 0; i < height * width; i += 1) {
    const v = values[i];
    const k = Math.round(position(drawn, v) * 255) * 3;
    image.data[i * 4] = drawn.lut[k];
    image.data[i * 4 + 1] = drawn.lut[k + 1];
    image.data[i * 4 + 2] = drawn.lut[k + 2];
    image.data[i * 4 + 3] = overlay ? Math.round(strength(drawn, v) * 255) : 255;
  }
  ctx.putImageData(image, 0, 0);
}

/** Resize a [h, w] map to [height, width] bilinearly, as torch's interpolate(align_corners=False) does. */
export function resize(values, h, w, height, width) {
  if (h === height && w === width) return values;
  const out = new Float32Array(height * width);
  const source = (i, inSize, outSize) => {
    const at = Math.max(0, ((i + 0.5) * inSize) / outSize - 0.5);
    const i0 = Math.min(inSize - 1, Math.floor(at));
    return [i0, Math.min(inSize - 1, i0 + 1), at - i0];
  };
  for (let y = 0; y < height; y += 1) {
    const [y0, y1, fy] = source(y, h, height);
    for (let x = 0; x < width; x += 1) {
      const [x0, x1, fx] = source(x, w, width);
      const top = values[y0 * w + x0] * (1 - fx) + values[y0 * w + x1] * fx;
      const bottom = values[y1 * w + x0] * (1 - fx) + values[y1 * w + x1] * fx;
      out[y * width + x] = top * (1 - fy) + bottom * fy;
    }
  }
  return out;
}
