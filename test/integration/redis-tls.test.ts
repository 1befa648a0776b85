// A Redis reached over TLS (rediss:) whose certificate is self-signed, as managed Redis services (Heroku's)
// give: refused by default with a message that says what to set, taken with SERVICE_REDIS_TLS_INSECURE=1.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { parseEnv } from '../../config/env.js';
import { createRedis, probeRedis, RedisUnreachableError } from '../../engine/platform/index.js';
import { eventually, freePort, listening } from '../support/harness.js';

describe('Redis over TLS with a self-signed certificate', function () {
  this.timeout(30_000);
  let dir: string;
  let server: ChildProcess;
  let url: string;

  before(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'redis-tls-'));
    execFileSync(
      'openssl',
      ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'key.pem', '-out', 'cert.pem', '-days', '1', '-subj', '/CN=localhost'],
      {
        cwd: dir,
        stdio: 'ignore',
      },
    );
    const port = await freePort();
    server = spawn(
      'redis-server',
      [
        '--port',
        '0',
        '--tls-port',
        String(port),
        '--tls-cert-file',
        'cert.pem',
        '--tls-key-file',
        'key.pem',
        '--tls-auth-clients',
        'no',
        '--save',
        '',
        '--appendonly',
        'no',
      ],
      { cwd: dir, stdio: 'ignore' },
    );
    await eventually(() => listening(port), 'the TLS redis-server to listen');
    url = `rediss://127.0.0.1:${port}`;
  });
  after(() => {
    server?.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('refuses the certificate by default, saying which variable takes it', async () => {
    const err = await probeRedis(url).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).to.be.instanceOf(RedisUnreachableError);
    expect((err as Error).message)
      .to.contain('self-signed certificate')
      .and.contain('SERVICE_REDIS_TLS_INSECURE=1');
  });

  it('takes it with SERVICE_REDIS_TLS_INSECURE=1: the probe, the connection and its duplicates', async () => {
    const config = parseEnv({ REDIS_URL: url, SERVICE_REDIS_TLS_INSECURE: '1' });
    expect(config.redisTlsInsecure).to.equal(true);
    await probeRedis(url, 2000, { insecure: config.redisTlsInsecure });
    const redis = createRedis(url, 'tls-test', {}, { insecure: true });
    const copy = redis.duplicate();
    try {
      expect(await redis.ping()).to.equal('PONG');
      expect(await copy.ping()).to.equal('PONG');
    } finally {
      redis.disconnect();
      copy.disconnect();
    }
  });
});
