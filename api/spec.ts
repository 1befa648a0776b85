// Loads api/openapi.yaml once. The validator gets its own copy: it annotates what it is given.
import { openApiDocument } from '../config/openapi-document.js';

export type OpenApiDocument = { openapi: string; paths: Record<string, Record<string, { operationId?: string }>>; [k: string]: unknown };

export function loadSpec(): OpenApiDocument {
  return structuredClone(openApiDocument() as OpenApiDocument);
}
