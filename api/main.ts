// The `web` process: the HTTP API only (Procfile).
import { runMain, openRuntime } from '../engine/process/index.js';
import { startWebServer } from './server.js';

await runMain('web', async (config, log) => {
  const rt = await openRuntime(config, log, { watchTemplates: true, servesApi: true });
  const web = await startWebServer(rt);
  log.info({ url: web.url }, 'web listening');
  process.stdout.write(`web listening on ${web.url}\n`);
  return {
    async close() {
      await web.close();
      await rt.close();
    },
  };
});
