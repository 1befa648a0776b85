// express-openapi-validator 5.6 finds a request's operation in its metadata middleware by walking every
// route of the spec on every request: for each it lists the route map again, looks the route's pair and
// schemas up, reads two app settings and compiles the route's path-to-regexp matcher, until one matches
// (an open upstream pull request, cdimascio/express-openapi-validator#1217, caches the matchers). On
// POST /api/v1/autonomy/run that walk was about a third of the validator's cost, 36 µs a request.
// Until the fix is released, the validator's `applyOpenApiMetadata` is replaced by the same middleware
// over a table of the routes compiled once: the same routes in the same order (the validator's own,
// most specific first), the same matchers and options, the same answers (`req.openapi`, 404, 405, 400 for
// a malformed escape; a 405's Allow names HEAD too where the path has GET, as app.ts serves it there). Only
// the walk changes: one RegExp test a route, and none before a route without parameters asked for by its
// own path.
import { createRequire } from 'node:module';
import path from 'node:path';
import type { NextFunction, Request, Response } from 'express';

const require = createRequire(import.meta.url);

type Methods = Record<string, unknown> & { basePath: string; _openApiRoute: string; _expressRoute: string };
type Context = {
  apiDoc: { paths: Record<string, Record<string, unknown>> };
  expressRouteMap: Record<string, Methods>;
  openApiRouteMap: Record<string, Methods>;
  useRequestUrl: boolean;
  serial: number;
  ignoreUndocumented: boolean;
  shouldIgnoreRoute(path: string): boolean;
  isManagedRoute(path: string): boolean;
};
type ResponseDoc = { paths: Record<string, Record<string, unknown>> } | undefined;
type HttpErrorClass = new (err: { path: string; message: string; headers?: Record<string, string> }) => Error;

/** A route of the spec as the lookup tests it. */
type CompiledRoute = { expressRoute: string; openApiRoute: string; pathKey: string; regexp: RegExp; keys: string[] };
/** The routes in the validator's order, and those with no parameters by their path. */
type Table = { routes: CompiledRoute[]; exact: Map<string, CompiledRoute> };

/** The validator's own modules (its copy of path-to-regexp, if it has one). */
function validatorModules() {
  const dist = path.dirname(require.resolve('express-openapi-validator'));
  const from = (p: string) => require(path.join(dist, p)) as Record<string, unknown>;
  return {
    metadata: from('middlewares/openapi.metadata.js') as { applyOpenApiMetadata: unknown },
    types: from('framework/types.js') as { NotFound: HttpErrorClass; MethodNotAllowed: HttpErrorClass; BadRequest: HttpErrorClass },
    httpMethods: (from('middlewares/parsers/schema.preprocessor.js') as { httpMethods: Set<string> }).httpMethods,
    pathToRegexp: (
      require(require.resolve('path-to-regexp', { paths: [dist] })) as {
        pathToRegexp: (route: string, o: { sensitive: boolean; strict: boolean }) => { regexp: RegExp; keys: { name: string }[] };
      }
    ).pathToRegexp,
  };
}

const REPLACED = Symbol.for('automation-service.route-lookup');

/** How many route tables the lookup compiled (one per app's spec and routing options), for tests. */
export type RouteLookupStats = { tablesCompiled: number };

/** Makes the validator's route lookup walk routes compiled once; idempotent. */
export function fastRouteLookup(): RouteLookupStats {
  const mod = validatorModules();
  const current = mod.metadata.applyOpenApiMetadata as { [REPLACED]?: RouteLookupStats };
  if (current[REPLACED]) return current[REPLACED];
  const { NotFound, MethodNotAllowed, BadRequest } = mod.types;
  const stats: RouteLookupStats = { tablesCompiled: 0 };
  /** The routes of a spec in the validator's order, compiled with the app's routing options. */
  const compile = (context: Context, sensitive: boolean, strict: boolean): Table => {
    const routes = Object.entries(context.expressRouteMap).map(([expressRoute, methods]): CompiledRoute => {
      const openApiRoute = methods._openApiRoute;
      const { regexp, keys } = mod.pathToRegexp(expressRoute, { sensitive, strict });
      return { expressRoute, openApiRoute, pathKey: openApiRoute.substring(methods.basePath.length), regexp, keys: keys.map((k) => k.name) };
    });
    // a route without parameters, looked up by its path as written, when the walk would find it too: no
    // route before it matches that path (case-sensitive routing only: the path is compared as it is)
    const exact = new Map<string, CompiledRoute>();
    if (sensitive)
      routes.forEach((route, i) => {
        if (!route.keys.length && route.regexp.test(route.expressRoute) && !routes.slice(0, i).some((r) => r.regexp.test(route.expressRoute)))
          exact.set(route.expressRoute, route);
      });
    stats.tablesCompiled++;
    return { routes, exact };
  };

  // called once per validator (its spec's context), on its first request
  function applyOpenApiMetadata(context: Context, responseApiDoc: ResponseDoc) {
    const tables = new Map<string, Table>();
    const tableFor = (req: Request): Table => {
      const sensitive = !!req.app.enabled('case sensitive routing');
      const strict = !!req.app.enabled('strict routing');
      const options = `${sensitive ? 1 : 0}${strict ? 1 : 0}`;
      let table = tables.get(options);
      if (!table) tables.set(options, (table = compile(context, sensitive, strict)));
      return table;
    };

    const match = (req: Request, route: CompiledRoute, url: string, method: string) => {
      const found = route.regexp.exec(url);
      if (!found) return null;
      let pathParams: Record<string, string>;
      try {
        const values = found.slice(1).map((v) => decodeURIComponent(v));
        pathParams = Object.fromEntries(route.keys.map((k, i) => [k, values[i]!]));
      } catch {
        throw new BadRequest({ path: req.path, message: `malformed uri'` });
      }
      return {
        schema: context.apiDoc.paths[route.pathKey]![method],
        _responseSchema: responseApiDoc?.paths[route.pathKey]![method],
        expressRoute: route.expressRoute,
        openApiRoute: route.openApiRoute,
        pathParams,
      };
    };

    const lookupRoute = (req: Request) => {
      const url = (context.useRequestUrl ? req.url : req.originalUrl).split('?')[0]!;
      const method = req.method.toLowerCase();
      const table = tableFor(req);
      const known = table.exact.get(url);
      if (known) return match(req, known, url, method);
      for (const route of table.routes) {
        const found = match(req, route, url, method);
        if (found) return found;
      }
      return null;
    };

    return (req: Request, _res: Response, next: NextFunction) => {
      // note base path is empty when path is fully qualified i.e. req.path.startsWith('')
      const p = req.path.startsWith(req.baseUrl) ? req.path : `${req.baseUrl}/${req.path}`;
      if (context.shouldIgnoreRoute(p)) return next();
      const matched = lookupRoute(req);
      if (matched) {
        const { expressRoute, openApiRoute, pathParams, schema } = matched;
        if (!schema) {
          // a route that matches on path but not on method
          if (context.ignoreUndocumented) return next();
          const allowed = Object.keys(context.openApiRouteMap[openApiRoute]!).filter((key) => mod.httpMethods.has(key.toLowerCase()));
          // HEAD is served wherever GET is (app.ts checks it as the GET it stands for), though the spec lists GETs only
          if (allowed.includes('GET') && !allowed.includes('HEAD')) allowed.splice(allowed.indexOf('GET') + 1, 0, 'HEAD');
          throw new MethodNotAllowed({ path: req.path, message: `${req.method} method not allowed`, headers: { Allow: allowed.join(', ') } });
        }
        const openapi: Record<string, unknown> = { expressRoute, openApiRoute, pathParams, schema, serial: context.serial };
        if (responseApiDoc) openapi._responseSchema = matched._responseSchema;
        (req as { openapi?: unknown }).openapi = openapi;
        req.params = pathParams;
      } else if (context.isManagedRoute(p) && !context.ignoreUndocumented) {
        throw new NotFound({ path: req.path, message: 'not found' });
      }
      next();
    };
  }
  (applyOpenApiMetadata as { [REPLACED]?: unknown })[REPLACED] = stats;
  mod.metadata.applyOpenApiMetadata = applyOpenApiMetadata;
  return stats;
}
