// What the server offers, read from /openapi.json: saliency methods with their parameters, and
// whether /interventions exists. Both the one-schema shape of SaliencyRequest (`method` an enum,
// method-specific fields named in their descriptions) and a union over `method` (oneOf with a
// discriminator, each variant with its own fields) are understood, so new methods need no change here.

/** Fields that are not a method's parameters: the page sets them itself (inputs, target picker, overlay), and
 * `dry_run` asks for the request's cost instead of running it, on every model-running endpoint alike. */
const PAGE_FIELDS = new Set(["model", "inputs", "method", "target", "format", "alpha", "dry_run"]);

function resolver(openapi) {
  const schemas = (openapi.components && openapi.components.schemas) || {};
  const resolve = (node) => {
    let current = node;
    for (let hops = 0; current && current.$ref && hops < 32; hops += 1) {
      const name = current.$ref.split("/").pop();
      current = schemas[name];
    }
    return current || {};
  };
  return resolve;
}

function requestSchema(openapi, path) {
  const resolve = resolver(openapi);
  const operation = openapi.paths && openapi.paths[path] && openapi.paths[path].post;
  const content = operation && operation.requestBody && operation.requestBody.content;
  const json = content && content["application/json"];
  if (json && json.schema) return resolve(json.schema);
  const fallback = { "/saliency": "SaliencyRequest", "/interventions": "InterventionsRequest" }[path];
  return resolve({ $ref: `#/components/schemas/${fallback}` });
}

/** Properties of an object schema, with allOf parts merged. */
function properties(schema, resolve) {
  const merged = { ...(schema.properties || {}) };
  for (const part of schema.allOf || []) Object.assign(merged, properties(resolve(part), resolve));
  return merged;
}

function unionOf(schema, resolve) {
  if (schema.oneOf || schema.anyOf) return schema.oneOf || schema.anyOf;
  for (const part of schema.allOf || []) {
    const inner = unionOf(resolve(part), resolve);
    if (inner) return inner;
  }
  return null;
}

/** One form field's description from a JSON schema property: kind, default, bounds, choices. */
export function describeField(name, prop, resolve) {
  let node = resolve(prop);
  let nullable = false;
  const options = node.anyOf || node.oneOf;
  if (options) {
    const concrete = options.map(resolve).filter((o) => o.type !== "null");
    nullable = concrete.length < options.length;
    node = { ...(concrete.length === 1 ? concrete[0] : { type: "string" }), ...stripUnion(node) };
  }
  const choices = node.enum || null;
  const kind = choices ? "enum" : { integer: "integer", number: "number", boolean: "boolean", array: "array" }[node.type] || "string";
  const fallback = prop.default !== undefined ? prop.default : node.default;
  const items = node.items ? resolve(node.items) : null;
  return {
    name,
    kind,
    itemKind: items ? items.type || "string" : null,
    nullable,
    choices,
    default: fallback === undefined ? null : fallback,
    minimum: node.minimum ?? node.exclusiveMinimum ?? null,
    maximum: node.maximum ?? node.exclusiveMaximum ?? null,
    title: prop.title || node.title || name,
    description: prop.description || node.description || "",
  };
}

function stripUnion(node) {
  const { anyOf, oneOf, ...rest } = node;
  return rest;
}

function methodOfVariant(variant, props, resolve, mapping) {
  const method = props.method ? resolve(props.method) : {};
  if (method.const !== undefined) return method.const;
  if (Array.isArray(method.enum) && method.enum.length === 1) return method.enum[0];
  if (props.method && props.method.default !== undefined) return props.method.default;
  if (mapping && variant.$ref) {
    const found = Object.entries(mapping).find(([, ref]) => ref === variant.$ref);
    if (found) return found[0];
  }
  return null;
}

/** The one-schema shape: a field belongs to the methods its description starts with ("gradcam: ..."). */
function ownersFromDescription(description, methods) {
  const head = description.match(/^\s*([a-z0-9_]+(?:\s*(?:,|\/|and|or)\s*[a-z0-9_]+)*)\s*[:\s]/i);
  if (!head) return null;
  const names = head[1].split(/\s*(?:,|\/|\band\b|\bor\b)\s*/).filter(Boolean);
  const owners = names.filter((n) => methods.includes(n));
  return owners.length === names.length && owners.length > 0 ? owners : null;
}

/** `[{name, default: bool, params: [field]}]`: every saliency method the API offers, with its fields. */
export function saliencyMethods(openapi) {
  const resolve = resolver(openapi);
  const schema = requestSchema(openapi, "/saliency");
  const variants = unionOf(schema, resolve);
  if (variants) {
    const mapping = schema.discriminator && schema.discriminator.mapping;
    const out = [];
    for (const variant of variants) {
      const resolved = resolve(variant);
      const props = properties(resolved, resolve);
      const name = methodOfVariant(variant, props, resolve, mapping);
      if (!name) continue;
      const params = Object.entries(props)
        .filter(([key]) => !PAGE_FIELDS.has(key))
        .map(([key, prop]) => describeField(key, prop, resolve));
      out.push({ name, params });
    }
    return out;
  }
  const props = properties(schema, resolve);
  const method = props.method ? resolve(props.method) : {};
  const names = method.enum || (method.anyOf || []).flatMap((o) => resolve(o).enum || []);
  const fields = Object.entries(props)
    .filter(([key]) => !PAGE_FIELDS.has(key))
    .map(([key, prop]) => ({ field: describeField(key, prop, resolve), owners: ownersFromDescription(prop.description || "", names) }));
  return names.map((name) => ({
    name,
    params: fields.filter(({ owners }) => !owners || owners.includes(name)).map(({ field }) => field),
  }));
}

/** The default method (the schema's default for `method`, else the first). */
export function defaultMethod(openapi, methods) {
  const resolve = resolver(openapi);
  const schema = requestSchema(openapi, "/saliency");
  const props = properties(schema, resolve);
  const fallback = props.method && props.method.default;
  return methods.some((m) => m.name === fallback) ? fallback : methods.length ? methods[0].name : null;
}

/** How to spell a channel-zeroing edit for /interventions, or null when the server has no such path. */
export function interventionsShape(openapi) {
  if (!(openapi.paths && openapi.paths["/interventions"] && openapi.paths["/interventions"].post)) return null;
  const resolve = resolver(openapi);
  const schema = requestSchema(openapi, "/interventions");
  const props = properties(schema, resolve);
  const editsKey = ["edits", "interventions"].find((key) => key in props) || "edits";
  let editProps = {};
  const list = props[editsKey] ? resolve(props[editsKey]) : {};
  if (list.items) {
    const item = resolve(list.items);
    const union = unionOf(item, resolve);
    editProps = union ? Object.assign({}, ...union.map((v) => properties(resolve(v), resolve))) : properties(item, resolve);
  }
  const siteKey = ["site", "layer", "module"].find((key) => key in editProps) || "site";
  let channelsPath = ["channels"];
  if (!("channels" in editProps)) {
    const nested = ["select", "selection", "where"].find((key) => key in editProps);
    if (nested) channelsPath = [nested, "channels"];
  }
  return { editsKey, siteKey, channelsPath };
}
