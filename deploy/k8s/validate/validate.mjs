// Validates Kubernetes manifests offline: node validate.mjs FILE.yaml...
// Built-in kinds against the Kubernetes OpenAPI schemas bundled in the npm
// package kubernetes-models, prometheus-operator kinds against
// @kubernetes-models/prometheus-operator, and KServe's ServingRuntime against
// the schema we wrote in schemas/ (unknown fields are errors, as the API
// server's strict field validation would report them; built-in types inside
// it, such as the containers, are checked by kubernetes-models). Prints one
// line per document; exits 1 if any document fails or has a kind it cannot
// check.
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import Ajv from "ajv";
import { parseAllDocuments } from "yaml";

const here = dirname(fileURLToPath(import.meta.url));

const crds = {
  "serving.kserve.io/v1alpha1/ServingRuntime": "servingruntime.json",
};
const ajv = new Ajv({ strict: false, allErrors: true, logger: false });
const int = (bits) => ({
  type: "number",
  validate: (n) => Number.isInteger(n) && n >= -(2 ** (bits - 1)) && n < 2 ** (bits - 1),
});
ajv.addFormat("int32", int(32));
ajv.addFormat("int64", int(64));

// "k8s": "IoK8sApiCoreV1Container" checks a value with that kubernetes-models
// validator; its errors are reported under the value's own path.
const k8sTypes = {};
async function loadK8sTypes(schema) {
  if (schema === null || typeof schema !== "object") return;
  if (typeof schema.k8s === "string" && !k8sTypes[schema.k8s]) {
    const pkg = schema.k8s.startsWith("IoK8sApimachinery") ? "@kubernetes-models/apimachinery" : "kubernetes-models";
    k8sTypes[schema.k8s] = (await import(`${pkg}/_schemas/${schema.k8s}`)).validate;
  }
  for (const v of Object.values(schema)) await loadK8sTypes(v);
}
// kubernetes-models' compiled validators leave out messages; ajv's wording.
function message(e) {
  switch (e.keyword) {
    case "type": return `must be ${e.params.type}`;
    case "required": return `must have required property '${e.params.missingProperty}'`;
    case "enum": return "must be equal to one of the allowed values";
    case "format": return `must match format "${e.params.format}"`;
    default: return `must pass "${e.keyword}" keyword validation`;
  }
}
ajv.addKeyword({
  keyword: "k8s",
  schemaType: "string",
  validate: function check(type, data, _schema, ctx) {
    const fn = k8sTypes[type];
    if (fn(data, { instancePath: ctx.instancePath, rootData: ctx.rootData })) return true;
    check.errors = fn.errors.map((e) => ({ ...e, message: e.message ?? message(e) }));
    return false;
  },
});

async function validator(apiVersion, kind) {
  const key = `${apiVersion}/${kind}`;
  if (crds[key]) {
    const schema = JSON.parse(readFileSync(join(here, "schemas", crds[key]), "utf8"));
    await loadK8sTypes(schema);
    const check = ajv.compile(schema);
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
