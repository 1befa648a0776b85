// The `worker` process: the BullMQ workers only (Procfile). Scale it horizontally. With
// SERVICE_WORKER_METRICS_PORT set it serves its own /metrics and /healthz.
import { runMain, openRuntime } from '../engine/process/index.js';
import { startWorkers, type Workers } from './index.js';
import { startMetricsServer, type MetricsServer } from './metrics-server.js';

await runMain('worker', async (config, log, stopping) => {
  const rt = await openRuntime(config, log);
  let workers: Workers | undefined;
  let metrics: MetricsServer | undefined;
  try {
    // its port first: one in use ends the start before any run is taken (taken, its attempt would be lost)
    metrics = config.workerMetricsPort === undefined ? undefined : await startMetricsServer(rt, () => workers, config.workerMetricsPort);
    if (metrics) log.info({ url: metrics.url }, 'worker metrics listening');
    workers = await startWorkers(rt, undefined, stopping);
  } catch (err) {
    await metrics?.close();
    await rt.close();
    throw err;
  }
  return {
    async close() {
      await metrics?.close();
      await workers!.close();
      await rt.close();
    },
  };
});
