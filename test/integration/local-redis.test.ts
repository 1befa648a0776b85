// The private redis-server of `npm start` and `npm test` on a machine with no Redis: it answers, keeps
// its data across a restart on the same data dir (AOF), replaces one an earlier owner left running, says
// in one line how to install redis-server when there is none, and starts only when nothing else will do.
import fs from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { parseEnv } from '../../config/env.js';
import { answersAt, ensureRedis, LocalRedisError, startLocalRedis } from '../../engine/process/index.js';
import { freePort } from '../support/harness.js';

async function withClient<T>(url: string, use: (redis: Redis) => Promise<T>): Promise<T> {
  const redis = new Redis(url, { maxRetriesPerRequest: 1 });
  try {
    return await use(redis);
  } finally {
    redis.disconnect();
  }
}

describe('private redis-server', function () {
  this.timeout(30_000);
  let dataDir: string;

  beforeEach(async () => {
    dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'local-redis-'));
  });
  afterEach(async () => {
    await fs.rm(dataDir, { recursive: true, force: true });
  });

  it('answers on a loopback port and keeps its data across a stop and a start on the same data dir', async () => {
    const first = await startLocalRedis({ dataDir });
    expect(first.url).to.equal(`redis://127.0.0.1:${first.port}`);
    expect(first.dir).to.equal(path.join(dataDir, 'redis'));
    await withClient(first.url, async (redis) => {
      expect(await redis.ping()).to.equal('PONG');
      await redis.set('kept', 'across restarts');
    });
    await first.stop();
    expect(await answersAt('127.0.0.1', first.port, 500)).to.equal(false);

    const second = await startLocalRedis({ dataDir });
    try {
      expect(await withClient(second.url, (redis) => redis.get('kept'))).to.equal('across restarts');
    } finally {
      await second.stop();
    }
  });

  it('stops the one an earlier owner left running on the data dir before it starts, and keeps its data', async () => {
    const left = await startLocalRedis({ dataDir });
    await withClient(left.url, (redis) => redis.set('written', 'before the owner died'));
    const next = await startLocalRedis({ dataDir });
    try {
      expect(next.pid).not.to.equal(left.pid);
      expect(await answersAt('127.0.0.1', left.port, 500)).to.equal(false);
      expect(await withClient(next.url, (redis) => redis.get('written'))).to.equal('before the owner died');
    } finally {
      await next.stop();
      await left.stop();
    }
  });

  it('says in one line how to install redis-server when there is none', async () => {
    const err = await startLocalRedis({ dataDir, redisServer: '/nonexistent/redis-server' }).catch((e: unknown) => e);
    expect(err).to.be.instanceOf(LocalRedisError);
    expect((err as Error).message).to.equal(
      'no Redis answers on 127.0.0.1:6379 and redis-server is not installed: apt-get install redis-server (Debian/Ubuntu) or brew install redis (macOS), or set REDIS_URL',
    );
  });

  it('starts for npm start only outside production, without REDIS_URL, when nothing answers on the default port', async () => {
    const config = parseEnv({ SERVICE_DATA_DIR: dataDir });
    const silent = await freePort();
    const { config: used, local } = await ensureRedis(config, { defaultPort: silent });
    try {
      expect(local).not.to.equal(null);
      expect(used.redisUrl).to.equal(local!.url);
      expect(await withClient(used.redisUrl, (redis) => redis.ping())).to.equal('PONG');
    } finally {
      await local?.stop();
    }

    const given = parseEnv({ SERVICE_DATA_DIR: dataDir, REDIS_URL: 'redis://127.0.0.1:1' });
    expect(await ensureRedis(given, { defaultPort: silent })).to.deep.equal({ config: given, local: null });
    const production = { ...config, isProduction: true };
    expect(await ensureRedis(production, { defaultPort: silent })).to.deep.equal({ config: production, local: null });
    const server = net.createServer((s) => s.end());
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const answering = (server.address() as net.AddressInfo).port;
      expect(await ensureRedis(config, { defaultPort: answering })).to.deep.equal({ config, local: null });
    } finally {
      server.close();
    }
  });
});
