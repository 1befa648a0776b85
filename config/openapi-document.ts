// api/openapi.yaml, parsed once a process. Parsing its YAML (over 200 KB) took about a quarter of a
// second of CPU at each start; the build writes the same document as JSON (dist/openapi.json, with the
// hash of the YAML it came from: scripts/openapi-json.mjs), read instead whenever that hash is the YAML's
// own, so an edited YAML is never answered from a stale copy.
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { parse } from 'yaml';
import { OPENAPI_FILE, PROJECT_ROOT } from './paths.js';

export const OPENAPI_JSON_FILE = path.join(PROJECT_ROOT, 'dist', 'openapi.json');

let cached: unknown;

/** The parsed document, shared: callers that change it must copy it first. */
export function openApiDocument(): unknown {
  return (cached ??= readOpenApiDocument(OPENAPI_FILE, OPENAPI_JSON_FILE));
}

/** The YAML file's document: from the JSON file when that holds the same YAML's hash, else parsed. */
export function readOpenApiDocument(yamlFile: string, jsonFile: string): unknown {
  const text = fs.readFileSync(yamlFile, 'utf8');
  const sha256 = createHash('sha256').update(text).digest('hex');
  try {
    const built = JSON.parse(fs.readFileSync(jsonFile, 'utf8')) as { sha256?: unknown; document?: unknown };
    if (built.sha256 === sha256 && built.document) return built.document;
  } catch {
    // not built (running from source before a build) or unreadable: the YAML itself
  }
  return parse(text);
}
