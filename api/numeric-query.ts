// Numeric query parameters must be finite numbers written in decimal. The validator (Ajv) takes "1e309"
// and "Infinity" as integers within every bound, since Infinity % 1 is NaN, and coerces "0x10" to 16;
// this check, made from the spec itself for every integer or number query parameter, refuses them with
// a 400 before the validator runs. A route matches as Express matches it: any case, a trailing slash.
import type { RequestHandler } from 'express';
import { pathPattern, type OpenApiDocument } from './spec.js';

type Parameter = { name?: string; in?: string; schema?: { type?: string | string[] }; $ref?: string };

function numericQueryParams(spec: OpenApiDocument): { method: string; pattern: RegExp; names: string[] }[] {
  const components = (spec as { components?: { parameters?: Record<string, Parameter> } }).components?.parameters ?? {};
  const resolve = (p: Parameter): Parameter => (p.$ref ? (components[p.$ref.split('/').pop()!] ?? {}) : p);
  const out: { method: string; pattern: RegExp; names: string[] }[] = [];
  for (const [path, item] of Object.entries(spec.paths)) {
    const shared = ((item as { parameters?: Parameter[] }).parameters ?? []).map(resolve);
    for (const [method, op] of Object.entries(item)) {
      if (method === 'parameters') continue;
      const params = [...shared, ...((op as { parameters?: Parameter[] }).parameters ?? []).map(resolve)];
      const names = params.filter((p) => p.in === 'query' && [p.schema?.type].flat().some((t) => t === 'integer' || t === 'number')).map((p) => p.name!);
      if (!names.length) continue;
      const pattern = pathPattern(path, { anyCase: true });
      out.push({ method: method.toUpperCase(), pattern, names });
    }
  }
  return out;
}

/** A number as people write one: sign, digits, a fraction, an exponent; not hex, not padded with spaces. */
const DECIMAL = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;

export function finiteNumericQuery(spec: OpenApiDocument): RequestHandler {
  const routes = numericQueryParams(spec);
  return (req, _res, next) => {
    const route = routes.find((r) => r.method === req.method && r.pattern.test(req.path));
    if (route) {
      const query = req.query as Record<string, unknown>;
      const bad = route.names.filter((n) => typeof query[n] === 'string' && query[n] !== '' && !(DECIMAL.test(query[n]) && Number.isFinite(Number(query[n]))));
      // refused as the validator refuses what breaks the schema (`bad-request` with `errors`), which it
      // would say of `limit=0`: one parameter, one code, whichever check finds it
      if (bad.length) {
        const errors = bad.map((n) => ({ path: `/query/${n}`, message: 'must be a finite decimal number' }));
        throw Object.assign(new Error(errors.map((e) => `${e.path}: ${e.message}`).join('; ')), { status: 400, errors });
      }
    }
    next();
  };
}
