// The record types the client declares in src/api.ts (where the OpenAPI document leaves items open), read with
// the TypeScript compiler, and a check that a real answer has exactly their fields with their JSON types.

import { readFileSync } from "node:fs";
import ts from "typescript";

const SOURCE = new URL("../src/api.ts", import.meta.url);

/** name -> {fields: Map(field -> type text), open: has an index signature} for each `export type X = {...}`. */
export function declaredRecords() {
  const file = ts.createSourceFile("api.ts", readFileSync(SOURCE, "utf8"), ts.ScriptTarget.ES2022, true);
  const out = new Map();
  for (const st of file.statements) {
    if (!ts.isTypeAliasDeclaration(st) || !ts.isTypeLiteralNode(st.type)) continue;
    const fields = new Map();
    let open = false;
    for (const m of st.type.members) {
      if (ts.isIndexSignatureDeclaration(m)) open = true;
      else if (ts.isPropertySignature(m) && m.type) fields.set(m.name.getText(file), m.type.getText(file));
    }
    out.set(st.name.text, { fields, open });
  }
  return out;
}

const RECORDS = declaredRecords();

/** Problems of `value` as the declared type `type` ("" when it fits). */
export function misfit(value, type, where = type) {
  const scalar = { string: "string", number: "number", boolean: "boolean" };
  if (type in scalar) return typeof value === scalar[type] ? "" : `${where}: ${JSON.stringify(value)} is not a ${type}\n`;
  if (type === "Record<string, unknown>" || type === "Record<string, number>") {
    if (typeof value !== "object" || value === null || Array.isArray(value)) return `${where}: not an object\n`;
    return type.endsWith("number>") ? Object.entries(value).map(([k, v]) => misfit(v, "number", `${where}.${k}`)).join("") : "";
  }
  if (type.endsWith("[]")) {
    if (!Array.isArray(value)) return `${where}: not an array\n`;
    return value.map((v, i) => misfit(v, type.slice(0, -2), `${where}[${i}]`)).join("");
  }
  const rec = RECORDS.get(type);
  if (!rec) return `${where}: the type ${type} is not checked here\n`;
  if (typeof value !== "object" || value === null) return `${where}: not an object\n`;
  let problems = "";
  for (const [field, t] of rec.fields) {
    problems += field in value ? misfit(value[field], t, `${where}.${field}`) : `${where}: no field ${field}\n`;
  }
  if (!rec.open) {
    for (const field of Object.keys(value)) if (!rec.fields.has(field)) problems += `${where}: undeclared field ${field}\n`;
  }
  return problems;
}
