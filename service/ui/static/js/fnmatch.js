// Python's fnmatch.fnmatchcase as a RegExp, so the tree filter matches exactly what the API matches.

export function hasWildcards(pattern) {
  return /[*?[]/.test(pattern);
}

function escapeRegExp(text) {
  return text.replace(/[.*+?^${}()|[\]\\/-]/g, "\\$&");
}

/** `*` any run (dots included), `?` one character, `[seq]` / `[!seq]` sets, as fnmatch.translate. */
export function fnmatchRegExp(pattern) {
  let out = "";
  let i = 0;
  while (i < pattern.length) {
    const c = pattern[i];
    i += 1;
    if (c === "*") {
      out += ".*";
    } else if (c === "?") {
      out += ".";
    } else if (c === "[") {
      let j = i;
      if (j < pattern.length && pattern[j] === "!") j += 1;
      if (j < pattern.length && pattern[j] === "]") j += 1;
      while (j < pattern.length && pattern[j] !== "]") j += 1;
      if (j >= pattern.length) {
        out += "\\[";
      } else {
        let body = pattern.slice(i, j).replace(/\\/g, "\\\\");
        i = j + 1;
        if (body.startsWith("!")) body = `^${body.slice(1)}`;
        else if (body.startsWith("^")) body = `\\${body}`;
        out += `[${body}]`;
      }
    } else {
      out += escapeRegExp(c);
    }
  }
  return new RegExp(`^(?:${out})$`, "s");
}

/** Layer names the API would pick for `pattern`: fnmatch for wildcards (never the root), else exact. */
export function matchLayers(names, pattern) {
  if (!hasWildcards(pattern)) return names.filter((name) => name === pattern);
  const re = fnmatchRegExp(pattern);
  return names.filter((name) => name !== "" && re.test(name));
}
