// writes ../msprobe/view/static/LICENSES.txt: the licences of the libraries bundled into app.js
import { readFileSync, writeFileSync } from "node:fs";

const bundled = [["echarts", "LICENSE"], ["echarts", "NOTICE"], ["zrender", "LICENSE"], ["tslib", "LICENSE.txt"]];
let out = "Libraries bundled into app.js (built from frontend/ with vite), with their licences.\n";
for (const [name, file] of bundled) {
  const pkg = JSON.parse(readFileSync(`node_modules/${name}/package.json`, "utf8"));
  out += `\n${"=".repeat(78)}\n${name} ${pkg.version} (${pkg.license})\n${"=".repeat(78)}\n\n`;
  out += readFileSync(`node_modules/${name}/${file}`, "utf8");
}
writeFileSync("../msprobe/view/static/LICENSES.txt", out);
