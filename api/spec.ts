// Loads api/openapi.yaml once. The validator gets its own copy: it annotates what it is given.
import { openApiDocument } from '../config/openapi-document.js';

export type OpenApiDocument = { openapi: string; paths: Record<string, Record<string, { operationId?: string }>>; [k: string]: unknown };

export function loadSpec(): OpenApiDocument {
  return structuredClone(openApiDocument() as OpenApiDocument);
}

/**
 * A path template of the spec (`/webhooks/{tenant_id}/codehost`) as the pattern of the paths it names: a
 * parameter is one segment, a trailing slash is taken; `anyCase` as Express's routers match (the API's own
 * routes are case-sensitive).
 */
export function pathPattern(template: string, opts: { anyCase?: boolean } = {}): RegExp {
  const parts = template.split(/\{[^}]+\}/).map((part) => part.replace(/[.*+?^$()|[\]\\]/g, '\\$&'));
  return new RegExp(`^${parts.join('[^/]+')}/?$`, opts.anyCase ? 'i' : '');
}
