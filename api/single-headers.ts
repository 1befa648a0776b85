// A header the spec names holds one value. Node joins a repeated one with ", " (or keeps the first, for
// Authorization), so two Idempotency-Keys became one key neither request named, and two Last-Event-IDs one
// id that is neither: a header of the spec's given more than once is refused with a 400 naming it.
import type { Request, RequestHandler } from 'express';
import type { OpenApiDocument } from './spec.js';

type Parameter = { name?: string; in?: string; $ref?: string };

/** Every header parameter of the spec's paths that `paths` takes (all by default), lower-cased. */
function headerNames(spec: OpenApiDocument, paths: (template: string) => boolean): Set<string> {
  const names = new Set<string>();
  const add = (p: Parameter) => {
    if (p.in === 'header' && p.name) names.add(p.name.toLowerCase());
  };
  const components = (spec as { components?: { parameters?: Record<string, Parameter> } }).components?.parameters ?? {};
  const resolve = (p: Parameter): Parameter => (p.$ref ? (components[p.$ref.split('/').pop()!] ?? {}) : p);
  for (const [template, item] of Object.entries(spec.paths)) {
    if (!paths(template)) continue;
    for (const [key, value] of Object.entries(item as Record<string, unknown>)) {
      const params = key === 'parameters' ? value : (value as { parameters?: unknown })?.parameters;
      if (Array.isArray(params)) (params as Parameter[]).forEach((p) => add(resolve(p)));
    }
  }
  return names;
}

/**
 * Refuses, where `applies`, a header of the spec's that a request gives more than once: a header of the paths
 * `paths` takes (all by default; a webhook intake's own headers there, not the API's).
 */
export function singleHeaders(spec: OpenApiDocument, applies: (req: Request) => boolean, paths: (template: string) => boolean = () => true): RequestHandler {
  const names = headerNames(spec, paths);
  return (req, _res, next) => {
    if (!applies(req)) return next();
    const raw = req.rawHeaders;
    let seen: Set<string> | undefined;
    let twice: Set<string> | undefined;
    for (let i = 0; i < raw.length; i += 2) {
      const name = raw[i]!.toLowerCase();
      if (!names.has(name)) continue;
      seen ??= new Set();
      if (seen.has(name)) (twice ??= new Set()).add(name);
      else seen.add(name);
    }
    if (twice) {
      const errors = [...twice].map((n) => ({ path: `/header/${n}`, message: 'is given more than once (it holds one value)' }));
      throw Object.assign(new Error(errors.map((e) => `${e.path}: ${e.message}`).join('; ')), { status: 400, errors });
    }
    next();
  };
}
