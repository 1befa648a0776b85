// Loads api/openapi.yaml once. The validator gets its own copy: it annotates what it is given.
import fs from 'node:fs';
import { parse } from 'yaml';
import { OPENAPI_FILE } from '../config/paths.js';

export type OpenApiDocument = { openapi: string; paths: Record<string, Record<string, { operationId?: string }>>; [k: string]: unknown };

let cached: OpenApiDocument | undefined;

export function loadSpec(): OpenApiDocument {
  cached ??= parse(fs.readFileSync(OPENAPI_FILE, 'utf8')) as OpenApiDocument;
  return structuredClone(cached);
}
