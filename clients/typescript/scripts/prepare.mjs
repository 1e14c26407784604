// `prepare`: build dist/ from src/. npm runs it on `npm install` inside this folder, on `npm pack`, and in this
// folder when another project installs it by path (`npm install ./clients/typescript`), where npm does not install
// this package's devDependencies: then they are installed here first, from the lock file.
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = join(root, "node_modules", "typescript", "bin", "tsc");
const npm = process.env.npm_execpath;  // the npm running this script
const run = (cmd, args) => execFileSync(cmd, args, { cwd: root, stdio: "inherit" });

if (!existsSync(tsc)) {
  const args = ["ci", "--ignore-scripts", "--no-audit", "--no-fund"];  // --ignore-scripts: not this script again
  if (npm) run(process.execPath, [npm, ...args]);
  else run(process.platform === "win32" ? "npm.cmd" : "npm", args);
}
run(process.execPath, [tsc, "-p", "tsconfig.json"]);
