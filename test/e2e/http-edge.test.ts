// The web server's edge, where a client holds what the server keeps for it: a long-poll when the server
// closes, requests pipelined ahead of their answers, and a client that stops reading its answers.
import { once } from 'node:events';
import fs from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { expect } from 'chai';
import { startWebServer } from '../../api/server.js';
import { eventually, KEYS, startHarness, type Harness } from '../support/harness.js';
import { rawExchange } from '../support/raw-http.js';

type Body = Record<string, any>;

/** The Redoc bundle (about 1 MB), asked for `n` times on one connection without waiting for an answer. */
const redocTimes = (n: number) => 'GET /redoc/redoc.standalone.js HTTP/1.1\r\nHost: x\r\n\r\n'.repeat(n);

/** A connection of its own to `h`, and the server's end of it (whose close is what the tests watch). */
async function connect(h: Harness): Promise<{ client: net.Socket; onServer: net.Socket }> {
  const accepted = once(h.web.server, 'connection') as Promise<[net.Socket]>;
  const client = net.connect(Number(new URL(h.url).port), '127.0.0.1');
  client.on('error', () => undefined);
  const [[onServer]] = await Promise.all([accepted, once(client, 'connect')]);
  return { client, onServer };
}

/** Whether `socket` closes within `ms` (a bound on waiting, with room for a busy machine). */
function closesWithin(socket: net.Socket, ms: number): Promise<boolean> {
  if (socket.destroyed) return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), ms);
    socket.once('close', () => {
      clearTimeout(timer);
      resolve(true);
    });
  });
}

describe('web server edge: long-polls at shutdown, pipelined requests, clients that stop reading', function () {
  this.timeout(60_000);

  let h: Harness;
  before(async () => {
    // no worker: audits stay running
    h = await startHarness({ workers: false });
    await fs.writeFile(path.join(h.tenantDir('tenant-a'), 'README.md'), '# a\n');
    await fs.writeFile(path.join(h.tenantDir('tenant-b'), 'README.md'), '# b\n');
  });
  after(async () => {
    await h.close();
  });

  it('answers an audit long-poll 202 with its report’s place at once when the server closes, not cut at the end of the grace period', async () => {
    // a web server of its own, to close
    const web = await startWebServer(h.rt, { port: 0, host: '127.0.0.1', validateResponses: true });
    try {
      // no worker runs the audit: its request waits its 60 s
      const answer = fetch(`${web.url}/api/v1/autonomy/workspace-audit/run`, {
        method: 'POST',
        headers: { authorization: `Bearer ${KEYS.a}`, 'content-type': 'application/json' },
        body: JSON.stringify({ timeout_seconds: 60, phases: ['sanity'] }),
      });
      await eventually(async () => (await h.rt.engine.audits.reports.listRunning(Date.now(), 100)).length > 0, 'the audit to start');
      const closedAt = Date.now();
      const closed = web.close(closedAt + 20_000);
      const res = await answer;
      const answeredIn = Date.now() - closedAt;
      const body = (await res.json()) as Body;
      expect(res.status, JSON.stringify(body)).to.equal(202);
      expect(body).to.deep.include({ status: 'running', location: `/api/v1/autonomy/workspace-audit/${body.report_id}` });
      expect(res.headers.get('location')).to.equal(body.location);
      expect(res.headers.get('connection')).to.equal('close');
      await closed;
      // at once, not at the cut 1 s before the end of the 20 s grace (a bound with room for a busy machine)
      expect(answeredIn).to.be.below(10_000);
    } finally {
      await web.close();
    }
  });

  it('closes at once, not at the cut near the end of the grace period, with connections that have sent no request (a spare a client opened ahead), and answers one sent as the close began', async () => {
    const web = await startWebServer(h.rt, { port: 0, host: '127.0.0.1', validateResponses: true });
    const opened: net.Socket[] = [];
    const open = async () => {
      const accepted = once(web.server, 'connection') as Promise<[net.Socket]>;
      const socket = net.connect(Number(new URL(web.url).port), '127.0.0.1');
      socket.on('error', () => undefined);
      opened.push(socket);
      await Promise.all([accepted, once(socket, 'connect')]);
      return socket;
    };
    try {
      const spares = [await open(), await open()];
      // written in the same turn as the close begins: the server has read none of it yet
      const sender = await open();
      let answer = '';
      sender.setEncoding('utf8').on('data', (d: string) => (answer += d));
      sender.write('GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n');
      const started = Date.now();
      await web.close(started + 20_000);
      // at once: the cut comes 1 s before the end of the 20 s grace (a bound with room for a busy machine)
      expect(Date.now() - started).to.be.below(5_000);
      for (const spare of spares) expect(await closesWithin(spare, 2000), 'a spare connection closed by the server').to.equal(true);
      expect(await closesWithin(sender, 2000)).to.equal(true);
      expect(answer, 'a request on its way as the close began is answered, not dropped').to.match(/^HTTP\/1\.1 200 /);
      expect(answer).to.match(/\r\nConnection: close\r\n/i);
    } finally {
      for (const socket of opened) socket.destroy();
      await web.close();
    }
  });

  it('closes a connection that pipelines more than 16 requests without reading their answers', async () => {
    const { client, onServer } = await connect(h);
    try {
      client.pause();
      client.write(redocTimes(40));
      expect(await closesWithin(onServer, 10_000), 'the server closed the connection').to.equal(true);
      expect(h.logs.join('')).to.contain('a connection sent more requests than it read answers: closed');
    } finally {
      client.destroy();
    }
  });

  it('serves a keep-alive client its sequential requests on one connection, and 16 pipelined ones it reads', async () => {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    let connections = 0;
    const counted = () => connections++;
    h.web.server.on('connection', counted);
    try {
      for (let i = 0; i < 40; i++) {
        const status = await new Promise<number>((resolve, reject) =>
          http
            .get(`${h.url}/healthz`, { agent }, (res) => {
              res.resume();
              res.on('end', () => resolve(res.statusCode!));
            })
            .on('error', reject),
        );
        expect(status).to.equal(200);
      }
      expect(connections, 'connections made').to.equal(1);
    } finally {
      h.web.server.off('connection', counted);
      agent.destroy();
    }
    const healthz = 'GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n';
    const { text } = await rawExchange(h.url, [[0, healthz.repeat(15) + 'GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n']], 15_000);
    expect(text.match(/HTTP\/1\.1 200 /g), text.slice(0, 500)).to.have.length(16);
  });

  it('closes an event stream whose connection then sends bytes that are not HTTP, without writing a 400 into the stream’s body', async () => {
    const { client, onServer } = await connect(h);
    try {
      let got = '';
      client.on('data', (d: Buffer) => (got += d.toString('latin1')));
      client.write(`GET /api/v1/autonomy/workspace-audit/stream?phases=sanity HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEYS.b}\r\n\r\n`);
      await eventually(async () => got.includes(': heartbeat'), 'a heartbeat of the stream');
      client.write('BLAH BLAH BLAH\0\r\n\r\n');
      expect(await closesWithin(onServer, 10_000), 'the server closed the connection').to.equal(true);
      expect(got.startsWith('HTTP/1.1 200 ')).to.equal(true);
      expect(got.match(/HTTP\/1\.1 /g), 'one answer on the connection').to.have.length(1);
    } finally {
      client.destroy();
    }
    // a request still owed its answer (a long-poll no worker answers): the 400 would be read as its answer
    const owed = await connect(h);
    try {
      let got = '';
      owed.client.on('data', (d: Buffer) => (got += d.toString('latin1')));
      const body = JSON.stringify({ timeout_seconds: 30, phases: ['sanity'] });
      owed.client.write(
        `POST /api/v1/autonomy/workspace-audit/run HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEYS.b}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
      );
      await new Promise((r) => setTimeout(r, 500));
      owed.client.write('BLAH BLAH BLAH\0\r\n\r\n');
      expect(await closesWithin(owed.onServer, 10_000), 'the server closed the connection').to.equal(true);
      expect(got).not.to.contain('400 Bad Request');
    } finally {
      owed.client.destroy();
    }
  });

  it('closes a connection whose client stopped reading within the stall bound, not twice it (Node lets the first timeout pass once the client took part of a write)', async () => {
    const web = await startWebServer(h.rt, { port: 0, host: '127.0.0.1', writeStallMs: 4000 });
    try {
      const accepted = once(web.server, 'connection') as Promise<[net.Socket]>;
      const client = net.connect(Number(new URL(web.url).port), '127.0.0.1');
      client.on('error', () => undefined);
      const [[onServer]] = await Promise.all([accepted, once(client, 'connect')]);
      try {
        client.pause();
        client.write(redocTimes(4));
        // the kernel's buffers take what they can within a moment; from then on no byte is taken
        await eventually(async () => onServer.writableLength > 0, 'the answers to wait to be written');
        const stalledAt = Date.now();
        expect(await closesWithin(onServer, 15_000), 'the server closed the stalled connection').to.equal(true);
        // within the bound (4 s) and a busy machine's late timers, not at twice it (8 s)
        expect(Date.now() - stalledAt).to.be.below(6500);
      } finally {
        client.destroy();
      }
    } finally {
      await web.close();
    }
  });

  it('closes a connection whose client stops reading its answers, not one whose answer is still being made nor an event stream read between heartbeats', async () => {
    const server = h.web.server;
    const bound = server.timeout;
    expect(bound, 'a bound on a stalled answer').to.be.above(0);
    // lowered for the test: the harness's heartbeats come every second
    server.timeout = 1000;
    const stopStream = new AbortController();
    try {
      // an event stream read by its client: an audit no worker runs sends heartbeats and nothing else
      const stream = await fetch(`${h.url}/api/v1/autonomy/workspace-audit/stream?phases=sanity`, {
        headers: { authorization: `Bearer ${KEYS.b}` },
        signal: stopStream.signal,
      });
      expect(stream.status).to.equal(200);
      let streamed = '';
      let streamEnded = false;
      const reading = (async () => {
        const decoder = new TextDecoder();
        for await (const chunk of stream.body!) streamed += decoder.decode(chunk as Uint8Array, { stream: true });
      })().then(
        () => (streamEnded = true),
        () => undefined,
      );
      // a long-poll whose answer says nothing for 3 s, three times the bound
      const running = () => h.rt.engine.audits.reports.listRunning(Date.now(), 100);
      const before = (await running()).length;
      const polled = h.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', { body: { timeout_seconds: 3, phases: ['sanity'] } });
      await eventually(async () => (await running()).length > before, 'the long-poll’s audit to start');
      // a client that reads nothing of 15 answers of 1 MB: more than the sockets' buffers hold
      const { client, onServer } = await connect(h);
      try {
        client.pause();
        client.write(redocTimes(15));
        expect(await closesWithin(onServer, 15_000), 'the server closed the stalled connection').to.equal(true);
        expect(h.logs.join('')).to.contain('a client took no byte of its answer for too long: connection closed');
      } finally {
        client.destroy();
      }
      const res = await polled;
      expect(res.status, res.text).to.equal(202);
      expect(streamEnded, 'the stream ended').to.equal(false);
      expect(streamed.match(/: heartbeat/g)?.length ?? 0, streamed).to.be.at.least(2);
      stopStream.abort();
      await reading;
    } finally {
      stopStream.abort();
      server.timeout = bound;
    }
  });
});
