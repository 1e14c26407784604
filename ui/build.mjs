// Builds the inspector into ../soul_apps/service/ui_dist (committed; the Python package ships it).
import { build } from "esbuild";
import { copyFileSync, mkdirSync, rmSync } from "node:fs";

const out = new URL("../soul_apps/service/ui_dist/", import.meta.url).pathname;
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
await build({
  entryPoints: { app: "src/main.tsx" },
  bundle: true,
  minify: true,
  format: "esm",
  target: ["es2022"],
  jsx: "automatic",
  jsxImportSource: "preact",
  outdir: out,
  legalComments: "none",
  logLevel: "info",
});
copyFileSync("src/index.html", out + "index.html");
