// The engine's Redis batch (engine/platform/redis-batch.ts), on the real Redis: the operations asked for
// in one turn of the event loop go in one script call, in order, each answered with its own result.
import net from 'node:net';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { redisBatch } from '../../engine/platform/index.js';
import { deleteRedisPrefix, testRedisUrl, uniquePrefix } from '../support/harness.js';

/**
 * The commands Redis runs, from MONITOR on a plain socket, each as its arguments. (ioredis's own monitor
 * mode races with other clients' commands, which the suite's parallel files send: a monitored line that
 * arrives with MONITOR's OK fails it with "Command queue state error".)
 */
async function monitorRedis(onCommand: (args: string[]) => void): Promise<net.Socket> {
  const url = new URL(testRedisUrl());
  const socket = net.connect(Number(url.port || 6379), url.hostname);
  await new Promise<void>((resolve, reject) => socket.once('connect', resolve).once('error', reject));
  let buffered = '';
  let ok: () => void;
  const monitoring = new Promise<void>((resolve) => (ok = resolve));
  socket.setEncoding('utf8').on('data', (chunk: string) => {
    buffered += chunk;
    const lines = buffered.split('\r\n');
    buffered = lines.pop()!;
    for (const line of lines) {
      if (line === '+OK') ok();
      // +<time> [<db> <client>] "command" "arg" ...
      const quoted = line.indexOf(' "');
      if (line.startsWith('+') && quoted > 0)
        onCommand(
          line
            .slice(quoted + 2, -1)
            .split('" "')
            .map((a) => a.replace(/\\"/g, '"')),
        );
    }
  });
  if (url.password) socket.write(`AUTH ${decodeURIComponent(url.username || 'default')} ${decodeURIComponent(url.password)}\r\n`);
  socket.write('MONITOR\r\n');
  await monitoring;
  return socket;
}

describe('the engine’s Redis batch', () => {
  let redis: Redis;
  let monitor: net.Socket;
  const prefix = uniquePrefix();
  const scriptCalls: string[][] = [];
  const marks: string[] = [];

  before(async () => {
    redis = new Redis(testRedisUrl(), { maxRetriesPerRequest: null });
    monitor = await monitorRedis((args) => {
      if (/^eval(sha)?$/i.test(args[0] ?? '') && args.some((a) => a.startsWith(prefix))) scriptCalls.push(args);
      if (args[0]?.toLowerCase() === 'get' && args[1]?.startsWith(`${prefix}:mark:`)) marks.push(args[1]);
    });
    const batch = redisBatch(redis);
    batch.define('test.push', { keys: 1, args: 1, lua: `return redis.call('RPUSH', KEYS[1], ARGV[1])` });
    batch.define('test.get', { keys: 1, args: 0, lua: `return redis.call('GET', KEYS[1]) or ''` });
  });
  after(async () => {
    monitor?.destroy();
    await deleteRedisPrefix(prefix);
    redis.disconnect();
  });

  /** Waits until MONITOR has reported every command sent before now (it reports them in the order Redis ran them). */
  const settled = async () => {
    const mark = `${prefix}:mark:${Math.random()}`;
    await redis.get(mark);
    for (let i = 0; i < 200 && !marks.includes(mark); i++) await new Promise((r) => setTimeout(r, 10));
  };

  it('sends the operations of one turn as one script call, in the order asked, each answered with its own result', async () => {
    const batch = redisBatch(redis);
    const list = `${prefix}:list`;
    await redis.set(`${prefix}:flag`, 'on');
    scriptCalls.length = 0;
    const answers = await Promise.all([
      ...Array.from({ length: 10 }, (_, i) => batch.call<number>('test.push', [list], [`item-${i}`])),
      batch.call<string>('test.get', [`${prefix}:flag`], []),
    ]);
    await settled();
    expect(answers).to.deep.equal([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 'on']);
    expect(await redis.lrange(list, 0, -1)).to.deep.equal(Array.from({ length: 10 }, (_, i) => `item-${i}`));
    expect(scriptCalls.length, 'one script call for the eleven operations').to.equal(1);
  });

  it('sends what later ticks and promises of the same turn ask for in that call too (a turn ends at setImmediate)', async () => {
    const batch = redisBatch(redis);
    const list = `${prefix}:pass`;
    scriptCalls.length = 0;
    const asked: Promise<number>[] = [];
    const push = (item: string) => asked.push(batch.call<number>('test.push', [list], [item]));
    push('first');
    process.nextTick(() => push('tick'));
    void Promise.resolve().then(() => push('promise'));
    push('sync');
    await new Promise((r) => setImmediate(r));
    await Promise.all(asked);
    await settled();
    expect(await redis.lrange(list, 0, -1)).to.deep.equal(['first', 'sync', 'tick', 'promise']);
    expect(scriptCalls.length, 'one script call for the four').to.equal(1);
  });

  it('splits a large turn into calls of at most 256 operations; a call that fails fails the operations of its turn, and the next turn works', async () => {
    const batch = redisBatch(redis);
    const list = `${prefix}:big`;
    scriptCalls.length = 0;
    const answers = await Promise.all(Array.from({ length: 300 }, (_, i) => batch.call<number>('test.push', [list], [String(i)])));
    await settled();
    expect(answers.at(-1)).to.equal(300);
    expect(scriptCalls.length).to.equal(2);

    // a string where a list is expected: the whole call of that turn fails, the next turn works
    const wrong = `${prefix}:a-string`;
    await redis.set(wrong, 'x');
    const failed = await Promise.allSettled([batch.call('test.push', [wrong], ['1']), batch.call('test.push', [`${prefix}:fine`], ['1'])]);
    expect(failed.map((f) => f.status)).to.deep.equal(['rejected', 'rejected']);
    expect(await batch.call<number>('test.push', [`${prefix}:fine`], ['2'])).to.be.a('number');
    let refused: unknown;
    await batch.call('test.push', [list], []).catch((err: unknown) => (refused = err));
    expect(String(refused)).to.contain('takes 1 keys and 1 arguments');
  });
});
