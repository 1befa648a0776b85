// /openapi.json, /docs (Swagger UI) and /redoc, served from npm packages (no CDN: the pages work
// offline). The caller mounts this router only outside production.
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import express, { Router } from 'express';
import { NO_FRAMING } from './admin.js';

const require = createRequire(import.meta.url);
const SWAGGER_DIR = path.dirname(require.resolve('swagger-ui-dist/package.json'));
const REDOC_BUNDLE = require.resolve('redoc/bundles/redoc.standalone.js');
/** Redoc's sidebar footer shows Redocly's logo from their CDN; the package ships no copy, so it is dropped. */
const REDOC_CDN_LOGO = 'https://cdn.redoc.ly/redoc/logo-mini.svg';
/** what the Swagger UI page loads of swagger-ui-dist */
const SWAGGER_ASSETS = new Set(['swagger-ui.css', 'swagger-ui-bundle.js', 'swagger-ui-standalone-preset.js']);

const SWAGGER_PAGE = `<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>Automation Backend API</title>
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <link rel="stylesheet" href="/docs/assets/swagger-ui.css">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="/docs/assets/swagger-ui-bundle.js"></script>
  <script src="/docs/assets/swagger-ui-standalone-preset.js"></script>
  <script src="/docs/init.js"></script>
</body>
</html>`;

// "Try it out" calls this same origin; persistAuthorization keeps the key across reloads.
const SWAGGER_INIT = `window.ui = SwaggerUIBundle({
  url: '/openapi.json',
  dom_id: '#swagger-ui',
  deepLinking: true,
  persistAuthorization: true,
  displayRequestDuration: true,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
  plugins: [SwaggerUIBundle.plugins.DownloadUrl],
  layout: 'StandaloneLayout'
});`;

const REDOC_PAGE = `<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>Automation Backend API reference</title>
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <style>body { margin: 0; padding: 0; }</style>
</head>
<body>
  <redoc spec-url="/openapi.json"></redoc>
  <script src="/redoc/redoc.standalone.js"></script>
</body>
</html>`;

export function docsRouter(spec: object): Router {
  const router = Router();
  const json = JSON.stringify(spec);
  // the pages may not be framed by another site; the assets are the three files the page loads, not the
  // package's own demo page (whose initializer loads the Petstore's spec)
  router.use(['/docs', '/redoc'], (_req, res, next) => {
    res.set(NO_FRAMING);
    next();
  });
  router.get('/openapi.json', (_req, res) => {
    res.type('application/json').send(json);
  });
  router.get('/docs', (_req, res) => {
    res.type('html').send(SWAGGER_PAGE);
  });
  router.get('/docs/init.js', (_req, res) => {
    res.type('application/javascript').send(SWAGGER_INIT);
  });
  const assets = express.static(SWAGGER_DIR, { index: false, maxAge: '1h' });
  router.use('/docs/assets', (req, res, next) => (SWAGGER_ASSETS.has(req.path.slice(1)) ? assets(req, res, next) : next()));
  router.get('/redoc', (_req, res) => {
    res.type('html').send(REDOC_PAGE);
  });
  let redocBundle: string | undefined;
  router.get('/redoc/redoc.standalone.js', (_req, res) => {
    // an img with an empty src loads nothing and Redoc hides it on its error
    redocBundle ??= fs.readFileSync(REDOC_BUNDLE, 'utf8').replaceAll(REDOC_CDN_LOGO, '');
    res.type('application/javascript').setHeader('cache-control', 'public, max-age=3600');
    res.send(redocBundle);
  });
  return router;
}
