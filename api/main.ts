// The `web` process: the HTTP API only (Procfile).
import { sweepTemp } from '../engine/platform/index.js';
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
  // what requests of a process that died left in the temp folder (an upload's spill file, a recogniser's audio)
  void sweepTemp().then(
    (n) => n && log.info({ removed: n }, 'removed temp files a process that died left'),
    (err: Error) => log.warn({ err: err.message }, 'temp files of a process that died not removed'),
  );
  process.stdout.write(`web listening on ${web.url}\n`);
  return {
    async close() {
      await web.close();
      await rt.close();
    },
  };
});
