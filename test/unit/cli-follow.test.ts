// The CLI's stream follower (cli/client.ts, ApiClient.follow) against stub servers: a stream that came back
// and sent only heartbeats is a connection, so a later drop starts the give-up clock again; one that is
// accepted and closed without a byte, or with bytes but no new event, again and again, is none, and the
// follower gives up; an event it cannot read, or one larger than the service sends, ends it at once.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { expect } from 'chai';
import { ApiClient, CliError, type ServiceEvent } from '../../cli/client.js';

const event = (id: number, type: string) => `id: ${id}\nevent: ${type}\ndata: ${JSON.stringify({ id: String(id), type, data: {} })}\n\n`;

describe('the CLI following an event stream', function () {
  this.timeout(20_000);
  let server: http.Server;
  afterEach(() => {
    server.closeAllConnections();
    server.close();
  });
  const stub = async (handler: (n: number, res: http.ServerResponse, lastId: string | undefined) => void): Promise<string> => {
    let n = 0;
    server = http.createServer((req, res) => handler(++n, res, req.headers['last-event-id'] as string | undefined));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  };
  const sse = (res: http.ServerResponse) => res.writeHead(200, { 'content-type': 'text/event-stream' }).flushHeaders();

  it('reconnects after a drop that follows a stream of heartbeats longer than the give-up time', async () => {
    const asked: (string | undefined)[] = [];
    const url = await stub((n, res, lastId) => {
      asked.push(lastId);
      sse(res);
      if (n === 1) return res.end(event(1, 'run.started'));
      if (n === 3) return res.end(event(2, 'run.finished'));
      // a step silent for longer than reconnectForMs: the service sends its heartbeat, then a restart cuts it
      const beat = setInterval(() => res.write(': heartbeat\n\n'), 200);
      setTimeout(() => {
        clearInterval(beat);
        res.end();
      }, 1500);
    });
    const seen: string[] = [];
    const last = await new ApiClient(url, 'k').follow('/api/v1/runs/run_x/events', {
      isLast: (e: ServiceEvent) => e.type === 'run.finished',
      onEvent: (e) => seen.push(e.type),
      reconnectForMs: 1000,
    });
    expect(last?.type).to.equal('run.finished');
    expect(seen).to.deep.equal(['run.started', 'run.finished']);
    expect(asked).to.deep.equal([undefined, '1', '1']);
  });

  it('gives up once streams accepted and closed without a byte have failed for reconnectForMs', async () => {
    let streams = 0;
    const url = await stub((_n, res) => {
      streams++;
      sse(res);
      res.end();
    });
    const started = Date.now();
    const err = await new ApiClient(url, 'k').follow('/api/v1/runs/run_x/events', { isLast: () => false, onEvent: () => undefined, reconnectForMs: 1000 }).then(
      () => null,
      (e: Error) => e,
    );
    expect(err?.message).to.contain('lost the event stream and could not reconnect: the stream ended early');
    expect(Date.now() - started).to.be.within(1000, 6000);
    expect(streams).to.be.greaterThan(1);
  });

  /** follow() to its end, or its error; a follower still going after `ms` is stopped and fails the test. */
  const followed = async (url: string, opts: { reconnectForMs?: number; onReconnect?: (attempt: number) => void } = {}, ms = 8000) => {
    const stop = new AbortController();
    const timer = setTimeout(() => stop.abort(new Error(`still following after ${ms / 1000} s`)), ms);
    try {
      return await new ApiClient(url, 'k')
        .follow('/api/v1/runs/run_x/events', { isLast: (e) => e.type === 'run.finished', onEvent: () => undefined, signal: stop.signal, ...opts })
        .then(
          () => null,
          (e: Error) => e,
        );
    } finally {
      clearTimeout(timer);
    }
  };

  it('gives up after reconnectForMs on streams that send bytes but nothing new each time, with a growing wait', async () => {
    let streams = 0;
    const url = await stub((n, res) => {
      streams++;
      sse(res);
      // the first a real event; then what the service sends before its events, an event without data, or the
      // event followed from sent again, and a drop
      res.end([event(1, 'run.started'), 'retry: 2000\n\n', 'event: run.started\n\n', event(1, 'run.started')][n === 1 ? 0 : 1 + (n % 3)]!);
    });
    const attempts: number[] = [];
    const started = Date.now();
    const err = await followed(url, { reconnectForMs: 1000, onReconnect: (a) => attempts.push(a) });
    expect(err?.message).to.contain('lost the event stream and could not reconnect');
    expect(Date.now() - started).to.be.below(6000);
    // the wait between tries grows while nothing new comes: 250, 500, 1000 ms (it was 250 ms, "try 1", for good)
    expect(attempts).to.deep.equal([1, 2, 3]);
    expect(streams).to.equal(4);
  });

  it('ends with exit 5 at the first event it cannot read, without reconnecting: it would be sent again', async () => {
    for (const data of ['{not json', 'null', '[1]', '"text"', '{"id":"1","data":{}}', '{"type":"run.started","data":7}']) {
      let streams = 0;
      const url = await stub((_n, res) => {
        streams++;
        sse(res);
        res.end(`id: 1\nevent: run.started\ndata: ${data}\n\n`);
      });
      const err = await followed(url, { reconnectForMs: 1000 });
      expect(err, data).to.be.instanceOf(CliError);
      expect((err as CliError).exitCode, data).to.equal(5);
      expect(err!.message, data).to.contain('the event stream sent an event that is not');
      expect(streams, data).to.equal(1);
      server.closeAllConnections();
      server.close();
    }
  });

  it('ends with exit 5 at a line or an event larger than the service sends, holding no more of it', async () => {
    const chunk = 'x'.repeat(64 * 1024);
    for (const [what, piece] of [
      ['a line', chunk],
      ['an event of many lines', `data: ${chunk}\n`],
    ] as const) {
      let sent = 0;
      const url = await stub((_n, res) => {
        sse(res);
        res.write('id: 1\nevent: run.started\n');
        // 600 MB unless the reader stops reading: it took the process to 2.3 GB
        const more = () => {
          while (sent < 600 * 1024 * 1024 && !res.destroyed) {
            sent += piece.length;
            if (!res.write(piece)) return void res.once('drain', more);
          }
        };
        more();
      });
      const err = await followed(url, { reconnectForMs: 1000 });
      expect((err as CliError)?.exitCode, what).to.equal(5);
      expect(err!.message, what).to.contain('longer than 4 MB');
      expect(sent, what).to.be.below(64 * 1024 * 1024);
      server.closeAllConnections();
      server.close();
    }
  });

  it('prints an event sent again after the id it followed from once', async () => {
    const seen: string[] = [];
    const url = await stub((n, res) => {
      sse(res);
      // a stream that resends its last event on each connection
      if (n === 1) return res.end(event(1, 'run.started'));
      res.end(event(1, 'run.started') + event(2, 'run.finished'));
    });
    await new ApiClient(url, 'k').follow('/x', { isLast: (e) => e.type === 'run.finished', onEvent: (e) => seen.push(e.id), reconnectForMs: 1000 });
    expect(seen).to.deep.equal(['1', '2']);
  });
});
