// Validates Kubernetes manifests offline: node validate.mjs FILE.yaml...
// Built-in kinds against the Kubernetes OpenAPI schemas bundled in the npm
// package kubernetes-models, prometheus-operator kinds against
// @kubernetes-models/prometheus-operator, and KServe's ServingRuntime against
// its CRD schema in schemas/ (strict: unknown fields are errors, as the API
// server's field validation would report them). Prints one line per document;
// exits 1 if any document fails or has a kind it cannot check.
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import Ajv from "ajv";
import { parseAllDocuments } from "yaml";

const here = dirname(fileURLToPath(import.meta.url));

// CRD structural schemas prune unknown fields; make them errors instead.
function strict(schema) {
  if (Array.isArray(schema)) return schema.map(strict);
  if (schema === null || typeof schema !== "object") return schema;
  const out = {};
  for (const [k, v] of Object.entries(schema)) {
    if (k.startsWith("x-kubernetes-")) continue;
    out[k] = k === "properties" ? Object.fromEntries(Object.entries(v).map(([p, s]) => [p, strict(s)])) : strict(v);
  }
  if (out.properties && out.additionalProperties === undefined &&
      !schema["x-kubernetes-preserve-unknown-fields"])
    out.additionalProperties = false;
  return out;
}

const crds = {
  "serving.kserve.io/v1alpha1/ServingRuntime": "servingruntime-v1alpha1.json",
};
const ajv = new Ajv({ strict: false, allErrors: true, logger: false });
const int = (bits) => ({
  type: "number",
  validate: (n) => Number.isInteger(n) && n >= -(2 ** (bits - 1)) && n < 2 ** (bits - 1),
});
ajv.addFormat("int32", int(32));
ajv.addFormat("int64", int(64));

async function validator(apiVersion, kind) {
  const key = `${apiVersion}/${kind}`;
  if (crds[key]) {
    const schema = JSON.parse(readFileSync(join(here, "schemas", crds[key]), "utf8"));
    const check = ajv.compile(strict(schema));
    return (doc) => {
      if (!check(doc)) throw new Error(ajv.errorsText(check.errors, { dataVar: "" }));
    };
  }
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  const module = group === "monitoring.coreos.com"
    ? `@kubernetes-models/prometheus-operator/${group}/${version}/${kind}`
    : `kubernetes-models/${group ? group + "/" : ""}${version}/${kind}`;
  let Model;
  try {
    Model = (await import(module))[kind];
  } catch {
    return null;
  }
  return (doc) => new Model(doc).validate();
}

let failed = 0;
for (const file of process.argv.slice(2)) {
  for (const d of parseAllDocuments(readFileSync(file, "utf8"))) {
    if (d.errors.length) {
      console.log(`error ${file}: YAML: ${d.errors[0].message}`);
      failed++;
      continue;
    }
    const doc = d.toJS();
    if (doc === null) continue;
    const what = `${file} ${doc.kind}/${doc.metadata?.name}`;
    const check = await validator(doc.apiVersion, doc.kind);
    if (!check) {
      console.log(`error ${what}: no schema for ${doc.apiVersion} ${doc.kind}`);
      failed++;
      continue;
    }
    try {
      check(doc);
      console.log(`ok ${what}`);
    } catch (e) {
      console.log(`error ${what}: ${e.message.split("\n")[0]}`);
      failed++;
    }
  }
}
process.exit(failed ? 1 : 0);
