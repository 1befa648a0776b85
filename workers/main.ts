// The `worker` process: the BullMQ workers only (Procfile). Scale it horizontally.
import { runMain, openRuntime } from '../engine/process/index.js';
import { startWorkers } from './index.js';

await runMain('worker', async (config, log) => {
  const rt = await openRuntime(config, log);
  const workers = await startWorkers(rt);
  return {
    async close() {
      await workers.close();
      await rt.close();
    },
  };
});
