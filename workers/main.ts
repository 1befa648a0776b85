// The `worker` process: the BullMQ workers only (Procfile). Scale it horizontally.
import { runMain } from '../engine/lifecycle.js';
import { openRuntime } from '../engine/runtime.js';
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
