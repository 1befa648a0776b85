// Baseline for run creation: a bare Express 5 route doing only queue.add on the same Redis. With
// BENCH_WORKER=1 (the end-to-end baseline) a no-op BullMQ worker at the service's default concurrency
// runs in the same process.
import express from 'express';
import { Queue, Worker } from 'bullmq';
import { Redis } from 'ioredis';

const connection = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', { maxRetriesPerRequest: null });
const prefix = process.env.SERVICE_QUEUE_PREFIX ?? 'bench-bare';
const queue = new Queue('bare', { connection, prefix });
const worker =
  process.env.BENCH_WORKER === '1'
    ? new Worker('bare', async () => undefined, { connection, prefix, concurrency: Number(process.env.SERVICE_WORKER_CONCURRENCY ?? 10) })
    : null;
const app = express();
app.use(express.json({ limit: '1mb' }));
app.post('/api/v1/autonomy/run', async (req, res) => {
  const job = await queue.add('run', req.body, { removeOnComplete: true });
  res.status(202).json({ run_id: job.id });
});
const server = app.listen(0, '127.0.0.1', () => {
  const address = server.address();
  process.stdout.write(`listening on http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}\n`);
});
process.on('SIGTERM', () => server.close(() => void (worker?.close() ?? Promise.resolve()).then(() => process.exit(0))));
