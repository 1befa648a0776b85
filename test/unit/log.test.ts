import { expect } from 'chai';
import { Writable } from 'node:stream';
import { Redis } from 'ioredis';
import { createLogger } from '../../engine/platform/index.js';

describe('logs', () => {
  it('never write the password of a refused AUTH that an ioredis error carries in its command', async () => {
    const redis = new Redis({ host: '127.0.0.1', port: 6379, lazyConnect: true, maxRetriesPerRequest: 0 });
    try {
      const err = await redis.auth('hunter2-from-the-url').catch((e: Error) => e);
      expect(err).to.be.instanceOf(Error);
      expect((err as unknown as { command: { args: string[] } }).command.args).to.include('hunter2-from-the-url');
      const lines: string[] = [];
      const log = createLogger('info', new Writable({ write: (chunk, _enc, done) => (lines.push(String(chunk)), done()) }));
      log.error({ err }, 'redis refused');
      log.warn({ step: { err } }, 'nested');
      expect(lines).to.have.length(2);
      for (const line of lines) {
        expect(line).to.not.contain('hunter2');
        expect(line).to.contain('[redacted]');
      }
    } finally {
      redis.disconnect();
    }
  });
});
