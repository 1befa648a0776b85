// The `worker` process: the BullMQ workers only (Procfile). Scale it horizontally. With
// SERVICE_WORKER_METRICS_PORT set it serves its own /metrics and /healthz.
import { runMain, openRuntime } from '../engine/process/index.js';
import { startWorkers } from './index.js';
import { startMetricsServer } from './metrics-server.js';

await runMain('worker', async (config, log) => {
  const rt = await openRuntime(config, log);
  const workers = await startWorkers(rt);
  const metrics = config.workerMetricsPort === undefined ? undefined : await startMetricsServer(rt, workers, config.workerMetricsPort);
  if (metrics) log.info({ url: metrics.url }, 'worker metrics listening');
  return {
    async close() {
      await metrics?.close();
      await workers.close();
      await rt.close();
    },
  };
});
