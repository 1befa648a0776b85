// `npm start`: the API and the workers in one process, on the embedded defaults (SQLite store,
// local Redis; outside production, a private redis-server when none answers and REDIS_URL is unset).
// Prints where the docs and the dashboard are and how to call the API.
import { startWebServer, type WebServer } from './api/server.js';
import { DASHBOARD_PATH } from './api/admin.js';
import type { Config } from './config/env.js';
import { redactUrl, type Logger } from './engine/platform/index.js';
import { ensureRedis, runMain, openRuntime, type LocalRedis } from './engine/process/index.js';
import { startWorkers, type Workers } from './workers/index.js';

await runMain('service', async (given, log, stopping) => {
  const { config, local } = await ensureRedis(given, { log });
  try {
    return await startService(config, log, local, stopping);
  } catch (err) {
    await local?.stop(); // runMain exits on a start-up error: the private redis-server must not outlive it
    throw err;
  }
});

async function startService(config: Config, log: Logger, local: LocalRedis | null, stopping: AbortSignal) {
  const rt = await openRuntime(config, log, { watchTemplates: true, servesApi: true });
  let web: WebServer | undefined;
  let workers: Workers;
  try {
    // the port first: one in use ends the start before any run is taken (taken, its attempt would be lost)
    web = await startWebServer(rt);
    workers = await startWorkers(rt, undefined, stopping);
  } catch (err) {
    await web?.close(Date.now());
    await rt.close();
    throw err;
  }
  const redis = local ? `private redis-server on ${local.url} (data in ${local.dir}, stopped with the service)` : redactUrl(config.redisUrl);
  const lines = [
    '',
    `Automation backend listening on ${web.url} (store: ${rt.store.kind}, redis: ${redis})`,
    config.isProduction ? '  API docs: off in production' : `  API docs:  ${web.url}/docs  (Swagger UI)   ${web.url}/redoc   ${web.url}/openapi.json`,
    `  Queues:    ${web.url}${DASHBOARD_PATH}  ${config.adminKeys.length ? '(HTTP Basic, any user, password = a key of SERVICE_ADMIN_KEYS)' : '(set SERVICE_ADMIN_KEYS to open it)'}`,
    config.auth === 'none'
      ? `  Auth:      off (SERVICE_AUTH=none): curl ${web.url}/api/v1/automations`
      : `  Call it:   npm run cli -- keys create --tenant acme   then   curl -H "Authorization: Bearer <key>" ${web.url}/api/v1/automations`,
    '',
  ];
  process.stdout.write(lines.join('\n') + '\n');
  return {
    async close(deadline: number) {
      // at once and together: the workers stop taking jobs while the web's requests finish, and the runs
      // they still have at the interrupt point go back to the queue before the exit
      await Promise.all([web.close(deadline), workers.close(deadline)]);
      await rt.close();
      await local?.stop();
    },
  };
}
