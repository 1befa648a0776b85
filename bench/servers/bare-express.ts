// The baseline: a bare Express 5 app doing the least the real routes must do: parse the JSON body
// and serialise a response of the same size as the service's (BENCH_FIXTURES names a JSON file
// holding the service's own list and create responses).
import fs from 'node:fs';
import express from 'express';

const fixtures = JSON.parse(fs.readFileSync(process.env.BENCH_FIXTURES!, 'utf8')) as { list: unknown; created: object };

const app = express();
app.use(express.json({ limit: '1mb' }));
app.get('/api/v1/automations', (_req, res) => {
  res.json(fixtures.list);
});
app.post('/api/v1/automations', (req, res) => {
  res.status(201).json({ ...fixtures.created, name: (req.body as { name?: string }).name });
});
const server = app.listen(Number(process.env.PORT ?? 0), '127.0.0.1', () => {
  const address = server.address();
  process.stdout.write(`listening on http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}\n`);
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
