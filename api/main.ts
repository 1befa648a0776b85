// The `web` process: the HTTP API only (Procfile).
import { runMain, openRuntime } from '../engine/process/index.js';
import { startWebServer } from './server.js';

await runMain('web', async (config, log) => {
  const rt = await openRuntime(config, log, { watchTemplates: true, servesApi: true });
  // a port in use ends the start: what the runtime opened is closed first, as the other processes do
  const web = await startWebServer(rt).catch(async (err: unknown) => {
    await rt.close();
    throw err;
  });
  log.info({ url: web.url }, 'web listening');
  process.stdout.write(`web listening on ${web.url}\n`);
  return {
    async close() {
      await web.close();
      await rt.close();
    },
  };
});
