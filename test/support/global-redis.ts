// `npm test` on a fresh machine: when REDIS_URL is unset and nothing answers on 127.0.0.1:6379, the suite
// runs on a private redis-server (engine/process/local-redis.ts) with its data in a temp dir, and REDIS_URL
// names it for the specs (read when used, through testRedisUrl()) and for every process they spawn.
// Loaded by .mocharc.json's "require"; mocha runs these fixtures after loading the spec files, before the
// first test, and stops the server after the last.
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { answersAt, DEFAULT_REDIS_HOST, DEFAULT_REDIS_PORT, startLocalRedis, type LocalRedis } from '../../engine/process/index.js';

let local: LocalRedis | null = null;
let dataDir: string | null = null;

export async function mochaGlobalSetup(): Promise<void> {
  if (process.env.REDIS_URL?.trim() || (await answersAt(DEFAULT_REDIS_HOST, DEFAULT_REDIS_PORT, 1000))) return;
  dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-test-redis-'));
  local = await startLocalRedis({ dataDir });
  process.env.REDIS_URL = local.url;
  process.stdout.write(`test: no Redis on ${DEFAULT_REDIS_HOST}:${DEFAULT_REDIS_PORT}; started a private redis-server on ${local.url}\n`);
}

export async function mochaGlobalTeardown(): Promise<void> {
  await local?.stop();
  if (dataDir) await fs.rm(dataDir, { recursive: true, force: true });
}
