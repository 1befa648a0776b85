// The CLI's stream follower (cli/client.ts, ApiClient.follow) against stub servers: a stream that came back
// and sent only heartbeats is a connection, so a later drop starts the give-up clock again; one that is
// accepted and closed without a byte, again and again, is none, and the follower gives up.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { expect } from 'chai';
import { ApiClient, type ServiceEvent } from '../../cli/client.js';

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
});
