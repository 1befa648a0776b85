// A worker process's own HTTP port (SERVICE_WORKER_METRICS_PORT): /metrics for what only this process
// sees (run durations, finishes by reason, queue waits), behind SERVICE_ADMIN_KEYS as on the web
// process, and /healthz for the platform's health check (open, it says nothing about tenants).
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { ADMIN_CHALLENGE, adminRefusal, isAdminRequest } from '../engine/auth/index.js';
import { answerClientError, answerProblem, probeRedisWrite, withTimeout } from '../engine/platform/index.js';
import { listenError, type Runtime } from '../engine/process/index.js';
import { assertStoreIsOurs } from '../engine/store/index.js';
import type { Workers } from './index.js';

export type MetricsServer = { url: string; close(): Promise<void> };

/** `workers`: the process's workers once they are started (the port is taken first: one in use fails before any run is taken). */
export async function startMetricsServer(rt: Runtime, workers: () => Workers | undefined, port: number): Promise<MetricsServer> {
  const server = http.createServer((req, res) => {
    // the path as sent: a request target no URL parses (`//[`) is only a path that is not served
    const pathname = (req.url ?? '/').split('?')[0] ?? '/';
    if (req.method !== 'GET' && req.method !== 'HEAD') return answerProblem(res, 'method-not-allowed', 'only GET', pathname, { allow: 'GET, HEAD' });
    if (pathname === '/healthz') {
      const all = workers()?.workers ?? [];
      const running = all.filter((w) => w.isRunning()).map((w) => w.name);
      // a write with a deadline, as the web's /readyz makes: a hung Redis keeps the connection 'ready' and answers
      // nothing, and one out of memory or made a replica answers PING and takes no write
      const said = (probe: Promise<unknown>) =>
        withTimeout(probe, 1000, 'no answer').then(
          () => 'ready',
          (err: Error) => err.message,
        );
      // and the store still this deployment's (a process of a new prefix may have moved it)
      void Promise.all([said(probeRedisWrite(rt.redis, rt.queues.prefix)), said(assertStoreIsOurs(rt.store, rt.queues.prefix))]).then(([redis, store]) => {
        const ok = all.length > 0 && running.length === all.length && redis === 'ready' && store === 'ready';
        res.writeHead(ok ? 200 : 503, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ status: ok ? 'ok' : 'degraded', process: 'worker', redis, store, queues: running }));
      });
      return;
    }
    if (pathname === '/metrics') {
      if (!isAdminRequest(req.headers, rt.config.adminKeys))
        return answerProblem(res, 'unauthorized', adminRefusal(rt.config.adminKeys), pathname, { 'www-authenticate': ADMIN_CHALLENGE });
      rt.metrics.registry.metrics().then(
        (text) => {
          res.writeHead(200, { 'content-type': rt.metrics.registry.contentType });
          res.end(text);
        },
        (err: Error) => {
          rt.log.warn({ err: err.message }, 'metrics collection failed');
          answerProblem(res, 'unavailable', 'metrics could not be collected', pathname);
        },
      );
      return;
    }
    answerProblem(res, 'not-found', 'this port serves /metrics and /healthz', pathname);
  });
  // what Node's parser refuses, as the web process answers it
  server.on('clientError', (err: Error & { code?: string }, socket) => answerClientError(err, socket, rt.log));
  await new Promise<void>((resolve, reject) => {
    server.once('error', (err) => reject(listenError(err, 'SERVICE_WORKER_METRICS_PORT', port)));
    server.listen(port, resolve);
  });
  const { port: bound } = server.address() as AddressInfo;
  return {
    url: `http://localhost:${bound}`,
    // its answers are quick, and a scraper's keep-alive connection would hold close() open (and the workers'
    // close after it): every connection is closed now
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
