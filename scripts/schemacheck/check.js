// Compiles every JSON Schema in a folder with ajv's strict mode (all strict
// options on: strictTypes, strictRequired, strictTuples …), so producers and
// consumers in other languages can load them without warnings.
// Usage: node check.js DIR
const Ajv2020 = require("ajv/dist/2020").default;
const addFormats = require("ajv-formats");
const fs = require("fs");
const path = require("path");

const dir = process.argv[2];
const problems = [];
const logger = { log() {}, warn: (m) => problems.push(m), error: (m) => problems.push(m) };
const ajv = new Ajv2020({ strict: true, allErrors: true, logger });
addFormats(ajv);
const files = fs.readdirSync(dir).filter((f) => f.endsWith(".json")).sort();
for (const f of files) ajv.addSchema(JSON.parse(fs.readFileSync(path.join(dir, f), "utf8")), f);
for (const f of files) {
  try {
    ajv.getSchema(f);
  } catch (e) {
    problems.push(`${f}: ${e.message}`);
  }
}
if (problems.length) {
  console.log(problems.join("\n"));
  console.log(`${problems.length} strict-mode problem(s) in ${dir}`);
  process.exit(1);
}
console.log(`all ${files.length} schemas compile in ajv strict mode`);
