// The SSE writer (api/sse.ts) with a hub of its own: what a stream holds when its client leaves early.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { expect } from 'chai';
import express from 'express';
import { OpenStreams, streamEvents } from '../../api/sse.js';
import { ServiceUnavailableError, type EventHub } from '../../engine/platform/index.js';

describe('SSE streams', () => {
  it('holds nothing for a client that left while the stream asked whether its events were trimmed', async () => {
    const streams = new OpenStreams();
    let subscribed = 0;
    let heartbeats = 0;
    let asked!: () => void;
    const askedOnce = new Promise<void>((r) => (asked = r));
    const hub = {
      droppedAfter: () => {
        asked();
        return new Promise((r) => setTimeout(() => r(null), 300)); // a slow round trip
      },
      lastId: async () => '0-0',
      subscribe: async () => {
        subscribed++;
        return { close() {} };
      },
      anyAfter: async () => false,
    } as unknown as EventHub;
    const app = express();
    app.get('/s', async (req, res) => {
      const write = res.write.bind(res) as (chunk: string) => boolean;
      res.write = ((chunk: string) => (chunk.startsWith(': heartbeat') && heartbeats++, write(chunk))) as typeof res.write;
      await streamEvents(req, res, { tenantId: 't', streams, hub, scope: { stream: 's', isLast: () => false }, afterId: '0-0', heartbeatMs: 50 });
    });
    const server = http.createServer(app);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    try {
      const { port } = server.address() as AddressInfo;
      const client = new AbortController();
      const request = fetch(`http://127.0.0.1:${port}/s`, { signal: client.signal }).catch(() => null);
      await askedOnce;
      client.abort();
      await request;
      await new Promise((r) => setTimeout(r, 600));
      expect({ open: streams.size, subscribed, heartbeats }).to.deep.equal({ open: 0, subscribed: 0, heartbeats: 0 });
    } finally {
      server.closeAllConnections();
      server.close();
    }
  });

  it('tells a reader catching up from the log that the log was trimmed past it meanwhile, once, before what is kept', async () => {
    const event = (n: number) => ({ id: `1-${n}`, type: 'step.output', tenant_id: 't', at: '2026-01-01T00:00:00Z', data: { n } });
    const log = [1, 2, 3, 4, 5].map(event);
    let trimmed = false;
    const hub = {
      // nothing trimmed when the stream opens; by the time it reads the log, what follows 1-1 is gone up to 1-4
      droppedAfter: async (_s: string, after: string) => {
        if (!trimmed) {
          trimmed = true;
          return null;
        }
        return after < '1-4' ? '1-4' : null;
      },
      lastId: async () => '1-5',
      subscribe: async () => ({ close() {} }),
      anyAfter: async () => false,
      after: async (_s: string, after: string, n: number) => log.filter((e) => e.id > after && (!trimmed || e.id === '1-1' || e.id >= '1-4')).slice(0, n),
    } as unknown as EventHub;
    const app = express();
    app.get('/s', async (req, res) => {
      await streamEvents(req, res, {
        tenantId: 't',
        streams: new OpenStreams(),
        hub,
        scope: { stream: 's', isLast: (e) => e.id === '1-5' },
        afterId: '1-1',
        heartbeatMs: 1000,
      });
    });
    const server = http.createServer(app);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    try {
      const { port } = server.address() as AddressInfo;
      const text = await (await fetch(`http://127.0.0.1:${port}/s`)).text();
      const notices = text.match(/event: stream\.truncated\ndata: (.*)\n/g) ?? [];
      expect(notices, text).to.have.length(1);
      expect(JSON.parse(notices[0]!.split('data: ')[1]!)).to.deep.include({ after: '1-1', first_kept: '1-4' });
      expect(text.indexOf('stream.truncated')).to.be.below(text.indexOf('id: 1-4'));
      expect(text).to.not.contain('id: 1-2\n');
      expect(text).to.contain('id: 1-5\n');
    } finally {
      server.closeAllConnections();
      server.close();
    }
  });

  it('writes nothing after a stream ended while it read the log (its key revoked, the process closing): a write after the end was an error no one heard', async () => {
    const event = (n: number) => ({ id: `1-${n}`, type: 'step.output', tenant_id: 't', at: '2026-01-01T00:00:00Z', data: { n } });
    const log = [1, 2, 3].map(event);
    const streams = new OpenStreams();
    let catchingUp = false;
    const hub = {
      // the log is trimmed past the reader once its catch-up has begun
      droppedAfter: async () => (catchingUp ? '1-2' : null),
      lastId: async () => '1-3',
      subscribe: async () => ({ close() {} }),
      anyAfter: async () => false,
      // while the catch-up reads the log, the stream is ended from elsewhere (here the process closing its streams)
      after: async (_s: string, after: string, n: number) => {
        catchingUp = true;
        streams.closeAll();
        return log.filter((e) => e.id > after).slice(0, n);
      },
    } as unknown as EventHub;
    const afterEnd: string[] = [];
    const errors: unknown[] = [];
    const app = express();
    app.get('/s', async (req, res) => {
      const write = res.write.bind(res) as (chunk: string) => boolean;
      res.write = ((chunk: string) => (res.writableEnded && afterEnd.push(chunk), write(chunk))) as typeof res.write;
      res.on('error', (err) => errors.push(err));
      await streamEvents(req, res, { tenantId: 't', streams, hub, scope: { stream: 's', isLast: () => false }, afterId: '1-1', heartbeatMs: 1000 });
    });
    const server = http.createServer(app);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    try {
      const { port } = server.address() as AddressInfo;
      const text = await (await fetch(`http://127.0.0.1:${port}/s`)).text();
      await new Promise((r) => setTimeout(r, 100));
      expect(afterEnd, 'written after the end').to.deep.equal([]);
      expect(errors).to.deep.equal([]);
      expect(text).to.not.contain('stream.truncated');
      expect(text).to.not.contain('id: 1-2');
    } finally {
      server.closeAllConnections();
      server.close();
    }
  });

  it('opens no stream while Redis has not said where its log ends: a 503 before any header, not a future Last-Event-ID taken or a gap untold', async () => {
    const streams = new OpenStreams();
    let subscribed = 0;
    const hub = {
      droppedAfter: async () => null,
      lastId: () => Promise.reject(new ServiceUnavailableError('Redis is not answering (reading the event log); retry shortly', 2)),
      subscribe: async () => {
        subscribed++;
        return { close() {} };
      },
    } as unknown as EventHub;
    const app = express();
    let failure: unknown;
    let headersSent: boolean | undefined;
    app.get('/s', async (req, res) => {
      const afterId = `${Date.now() + 3_600_000}-0`;
      await streamEvents(req, res, { tenantId: 't', streams, hub, scope: { stream: 's', isLast: () => false }, afterId, heartbeatMs: 50 }).catch((err) => {
        failure = err;
        headersSent = res.headersSent;
        res.status(503).end();
      });
    });
    const server = http.createServer(app);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    try {
      const { port } = server.address() as AddressInfo;
      expect((await fetch(`http://127.0.0.1:${port}/s`)).status).to.equal(503);
      expect(failure).to.be.instanceOf(ServiceUnavailableError);
      expect({ headersSent, subscribed, open: streams.size }).to.deep.equal({ headersSent: false, subscribed: 0, open: 0 });
    } finally {
      server.closeAllConnections();
      server.close();
    }
  });

  it('ends at once a stream that opens after every stream was closed (a shutdown while it was being prepared)', async () => {
    const streams = new OpenStreams();
    streams.closeAll();
    let ended = false;
    streams.add(() => (ended = true));
    await Promise.resolve();
    expect(ended).to.equal(true);
    expect(streams.size).to.equal(0);
  });
});
