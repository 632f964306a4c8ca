// Copies the dashboard's third-party browser files from web/node_modules (filled by `npm ci`)
// into metricsd/http/static/vendor/, where they ship inside the Python package.
// Run from anywhere: `node web/copy-vendor.mjs` (or `npm run vendor --prefix web`).
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const web = dirname(fileURLToPath(import.meta.url));
const dest = join(web, "..", "metricsd", "http", "static", "vendor");
const uplot = join(web, "node_modules", "uplot");
const files = [
  ["dist/uPlot.iife.min.js", "uPlot.iife.min.js"],
  ["dist/uPlot.min.css", "uPlot.min.css"],
  ["LICENSE", "uPlot.LICENSE"],
];

mkdirSync(dest, { recursive: true });
for (const [from, to] of files) {
  copyFileSync(join(uplot, from), join(dest, to));
}
const version = JSON.parse(readFileSync(join(uplot, "package.json"), "utf8")).version;
writeFileSync(join(dest, "VERSIONS.txt"), `uplot ${version} (MIT, see uPlot.LICENSE), from npm via web/package-lock.json\n`);
console.log(`copied uplot ${version} into ${dest}`);
