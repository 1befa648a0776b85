// Baseline for webhook intake: a bare Express 5 route that reads the body and does only queue.add on
// the same Redis: no verification, no store, no de-duplication.
import express from 'express';
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';

const connection = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', { maxRetriesPerRequest: null });
const queue = new Queue('bare-webhooks', { connection, prefix: process.env.SERVICE_QUEUE_PREFIX ?? 'bench-bare' });
const app = express();
app.post('/webhooks/:tenant/:kind', express.raw({ type: () => true, limit: '1mb' }), async (req, res) => {
  const job = await queue.add('delivery', { tenant: req.params.tenant, body: (req.body as Buffer).toString('utf8') }, { removeOnComplete: true });
  res.status(200).json({ delivery_id: job.id, status: 'accepted' });
});
const server = app.listen(0, '127.0.0.1', () => {
  const address = server.address();
  process.stdout.write(`listening on http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}\n`);
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
