// POST /api/v1/autonomy/voice/transcribe with the `openai` provider, against a local server that speaks
// the OpenAI transcription protocol (what we do not own), recording what it was sent.
import { mkdirSync } from 'node:fs';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import busboy from 'busboy';
import { expect } from 'chai';
import { PassThrough } from 'node:stream';
import { voiceOf, type Transcriber } from '../../engine/voice/index.js';
import { eventually, KEYS, startHarness, type Harness } from '../support/harness.js';
import { chunk, imaAdpcm, padded, riff, wav } from '../support/audio.js';

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Body = Record<string, any>;

const KEY = 'sk-test-0123456789abcdefSECRET';

type Received = { at: number; authorization?: string; fields: Record<string, string>; file?: { bytes: Buffer; filename: string; mimeType: string } };
/** `early`: answered as soon as the request arrives, before its body is read (as a rate limiter at the door does) */
/** 'hang': reads the whole request and never answers; 'stall': reads none of it and never answers (a provider stuck behind its own backlog) */
type Turn = { status: number; headers?: Record<string, string>; body?: unknown; early?: boolean; delayMs?: number } | 'hang' | 'stall';

const VERBOSE = {
  task: 'transcribe',
  language: 'english',
  duration: 1.5,
  text: 'hello there',
  segments: [{ id: 0, start: 0, end: 1.5, text: 'hello there', tokens: [1, 2] }],
};

async function startProvider() {
  const received: Received[] = [];
  let script: Turn[] = [];
  /** bytes of request bodies read so far, complete or not */
  const live = { bytes: 0 };
  const server = http.createServer((req, res) => {
    const got: Received = { at: Date.now(), authorization: req.headers.authorization, fields: {} };
    req.on('data', (c: Buffer) => (live.bytes += c.length));
    const next = script[0];
    if (next === 'stall') {
      script.shift();
      received.push(got);
      req.pause();
      return;
    }
    if (next && next !== 'hang' && next.early) {
      script.shift();
      received.push(got);
      res.writeHead(next.status, { 'content-type': 'application/json', connection: 'close', ...next.headers }).end('{"error":{"message":"slow down"}}');
      req.resume();
      return;
    }
    const bb = busboy({ headers: req.headers });
    bb.on('field', (name, value) => (got.fields[name] = value));
    bb.on('file', (_name, file, info) => {
      const chunks: Buffer[] = [];
      file.on('data', (c: Buffer) => chunks.push(c));
      file.on('end', () => (got.file = { bytes: Buffer.concat(chunks), filename: info.filename ?? '', mimeType: info.mimeType }));
    });
    // an upload the service broke off (it refused what it was passing on) is not a request the provider answers
    bb.on('error', () => res.destroy());
    bb.on('close', () => {
      received.push(got);
      const turn = script.shift() ?? { status: 200, body: VERBOSE };
      if (turn === 'hang' || turn === 'stall') return;
      setTimeout(
        () =>
          res
            .writeHead(turn.status, { 'content-type': 'application/json', ...turn.headers })
            .end(JSON.stringify(turn.body ?? { error: { message: `leaked ${KEY}` } })),
        turn.delayMs ?? 0,
      );
    });
    req.pipe(bb);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`,
    received,
    live,
    play(turns: Turn[]) {
      script = turns;
      received.length = 0;
      live.bytes = 0;
    },
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

async function upload(h: Harness, form: FormData, o: { key?: string; headers?: Record<string, string> } = {}) {
  const res = await fetch(`${h.url}/api/v1/autonomy/voice/transcribe`, {
    method: 'POST',
    headers: { authorization: `Bearer ${o.key ?? KEYS.a}`, ...o.headers },
    body: form,
  });
  const text = await res.text();
  return { status: res.status, text, body: JSON.parse(text) };
}

const raw = (h: Harness, bytes: Buffer, type = 'audio/wav', o: { query?: string; key?: string; headers?: Record<string, string> } = {}) =>
  h.call<Body>('POST', `/api/v1/autonomy/voice/transcribe${o.query ? `?${o.query}` : ''}`, {
    raw: bytes,
    key: o.key,
    headers: { 'content-type': type, ...o.headers },
  });

function formOf(audio: Buffer, fields: Record<string, string>): FormData {
  const form = new FormData();
  form.append('file', new Blob([audio], { type: 'audio/wav' }), 'note.wav');
  for (const [k, v] of Object.entries(fields)) form.append(k, v);
  return form;
}

describe('voice transcription', function () {
  let provider: Awaited<ReturnType<typeof startProvider>>;
  let h: Harness;

  before(async () => {
    provider = await startProvider();
    h = await startHarness({
      workers: false,
      env: {
        SERVICE_TRANSCRIBE_PROVIDER: 'openai',
        SERVICE_TRANSCRIBE_BASE_URL: provider.url,
        SERVICE_TRANSCRIBE_API_KEY: KEY,
        SERVICE_TRANSCRIBE_MODEL: 'whisper-1',
        SERVICE_TRANSCRIBE_MAX_SECONDS: '60',
        // spoken goals need an agent endpoint to be accepted; no worker runs them here
        SERVICE_AGENT_BASE_URL: 'http://127.0.0.1:9/v1',
        SERVICE_AGENT_MODEL: 'none',
      },
      // the provider's time covers its whole answer (an 11 MB one below) and a retry's wait: 400 ms was too little
      // on a busy machine; only the test of the timeout itself waits for it
      runtime: { transcribe: { timeoutMs: 2000, maxRetryDelayMs: 200 } },
    });
  });
  after(async () => {
    await h?.close();
    await provider?.close();
  });

  it('forwards a multipart upload with its language and prompt and answers the transcript', async () => {
    provider.play([{ status: 200, body: VERBOSE }]);
    const audio = wav(0.5);
    const form = new FormData();
    form.append('file', new Blob([audio], { type: 'audio/wav' }), 'note.wav');
    form.append('language', 'en');
    form.append('prompt', 'Names: Ada, Grace.');
    const res = await upload(h, form);
    expect(res.status, res.text).to.equal(200);
    expect(res.body).to.deep.equal({
      text: 'hello there',
      language: 'english',
      duration_seconds: 1.5,
      segments: [{ start: 0, end: 1.5, text: 'hello there' }],
      provider: 'openai',
      model: 'whisper-1',
    });
    expect(provider.received).to.have.length(1);
    const got = provider.received[0]!;
    expect(got.authorization).to.equal(`Bearer ${KEY}`);
    expect(got.fields).to.deep.equal({ model: 'whisper-1', response_format: 'verbose_json', language: 'en', prompt: 'Names: Ada, Grace.' });
    expect(got.file!.bytes.equals(audio)).to.equal(true);
    expect(got.file!.mimeType).to.equal('audio/wav');
  });

  it('answers a provider’s text as well-formed Unicode and no time of it negative', async () => {
    // (JSON.stringify writes a lone surrogate as its escape, as a provider's JSON may hold it)
    provider.play([{ status: 200, body: { text: 'ab\ud800c', language: 'english', duration: -1, segments: [{ start: -2, end: 1, text: '\udc00' }] } }]);
    const form = new FormData();
    form.append('file', new Blob([wav(0.5)], { type: 'audio/wav' }), 'note.wav');
    const res = await upload(h, form);
    expect(res.status, res.text).to.equal(200);
    expect(res.body.text).to.equal('ab\ufffdc');
    expect(res.body.segments).to.deep.equal([{ start: 0, end: 1, text: '\ufffd' }]);
    expect(res.body.duration_seconds === null || res.body.duration_seconds >= 0, String(res.body.duration_seconds)).to.equal(true);
  });

  it('takes a raw audio/wav body and logs one line with no text', async () => {
    provider.play([{ status: 200, body: { ...VERBOSE, text: 'secret words' } }]);
    const res = await raw(h, wav(1));
    expect(res.status, res.text).to.equal(200);
    expect(res.body.text).to.equal('secret words');
    expect(provider.received[0]!.fields).to.deep.equal({ model: 'whisper-1', response_format: 'verbose_json' });
    const lines = h.logs.filter((l) => l.includes('audio transcribed'));
    expect(lines.length).to.be.greaterThan(0);
    const last = JSON.parse(lines.at(-1)!);
    expect(last).to.include({ bytes: wav(1).length, provider: 'openai', model: 'whisper-1' });
    expect(last.latency_ms).to.be.a('number');
    expect(h.logs.join('')).not.to.contain('secret words');
    // the bytes say what it is, whatever a recorder names it
    for (const type of ['audio/x-wav', 'audio/wave', 'application/octet-stream', 'video/webm']) {
      provider.play([{ status: 200, body: VERBOSE }]);
      const named = await raw(h, wav(1), type);
      expect(named.status, `${type}: ${named.text}`).to.equal(200);
    }
    expect((await raw(h, wav(1), 'text/plain')).status, 'not audio by its name').to.equal(415);
    // nor JSON, which the route never takes: refused for its type, not read as JSON (a 400 malformed-json, or past 1 MB a 413)
    for (const bytes of [wav(1), wav(60)]) {
      const json = await raw(h, bytes, 'application/json');
      expect(json.status, json.text).to.equal(415);
      expect(json.body.code).to.equal('unsupported-media-type');
    }
    // no type at all is application/octet-stream (RFC 9110 §8.3), which the route takes: a Buffer is sent with none
    provider.play([{ status: 200, body: VERBOSE }]);
    const untyped = await h.call<Body>('POST', '/api/v1/autonomy/voice/transcribe', { raw: wav(1) });
    expect(untyped.status, untyped.text).to.equal(200);
    // and with no bytes either: an empty upload (422), not a request of no type (415 "unsupported media type undefined")
    const nothing = await h.call<Body>('POST', '/api/v1/autonomy/voice/transcribe', { raw: Buffer.alloc(0) });
    expect(nothing.status, nothing.text).to.equal(422);
    expect(nothing.body.code).to.equal('audio-invalid');
    // over the JSON bodies' 1 MB: audio has its own limit, raw as in a form
    const minute = wav(60);
    expect(minute.length).to.be.greaterThan(1024 * 1024);
    provider.play([{ status: 200, body: VERBOSE }]);
    const long = await raw(h, minute);
    expect(long.status, long.text).to.equal(200);
  });

  it('passes the audio on while it arrives, and the provider cannot finish before the client has', async () => {
    provider.play([{ status: 200, body: VERBOSE }]);
    const audio = wav(20);
    const req = http.request(`${h.url}/api/v1/autonomy/voice/transcribe`, {
      method: 'POST',
      headers: { authorization: `Bearer ${KEYS.a}`, 'content-type': 'audio/wav', 'content-length': String(audio.length) },
    });
    const answered = new Promise<{ status: number; body: string }>((resolve, reject) => {
      req.on('response', (res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c));
        res.on('end', () => resolve({ status: res.statusCode!, body }));
      });
      req.on('error', reject);
    });
    const half = audio.length / 2;
    req.write(audio.subarray(0, half));
    // half the audio has been sent and the client waits: the provider is reading it already
    await eventually(async () => provider.live.bytes >= half - 64 * 1024 || null, 'the provider to read the first half');
    expect(provider.received, 'no complete request yet').to.have.length(0);
    req.end(audio.subarray(half));
    const res = await answered;
    expect(res.status, res.body).to.equal(200);
    expect(provider.received[0]!.file!.bytes.equals(audio)).to.equal(true);
  });

  it('sends the whole upload again when the provider refused it at the door while it was still arriving', async () => {
    provider.play([
      { status: 429, headers: { 'retry-after': '0' }, early: true },
      { status: 200, body: VERBOSE },
    ]);
    const audio = wav(30);
    const req = http.request(`${h.url}/api/v1/autonomy/voice/transcribe`, {
      method: 'POST',
      headers: { authorization: `Bearer ${KEYS.a}`, 'content-type': 'audio/wav', 'content-length': String(audio.length) },
    });
    const answered = new Promise<number>((resolve, reject) => {
      req.on('response', (res) => res.resume().on('end', () => resolve(res.statusCode!)));
      req.on('error', reject);
    });
    let lastSent = 0;
    for (let at = 0; at < audio.length; at += 32 * 1024) {
      lastSent = Date.now();
      req.write(audio.subarray(at, at + 32 * 1024));
      await new Promise((r) => setTimeout(r, 10));
    }
    req.end();
    expect(await answered).to.equal(200);
    expect(provider.received).to.have.length(2);
    expect(provider.received[1]!.file!.bytes.equals(audio), 'the retry carries every byte, in order').to.equal(true);
    // the retry reads the upload's file: it is made once that is whole, not opened at once and left idle while the
    // client sends the rest (a provider's proxy closes a request that sends nothing for a while: a 502 for a 429)
    expect(provider.received[1]!.at, 'the retry asked once the upload had all arrived').to.be.at.least(lastSent);
  });

  it('survives forms cut short, refuses what busboy would drop, and leaves no temporary file when a client goes away', async () => {
    provider.play(['hang']);
    const spills = () => new Set(fs.readdirSync(os.tmpdir()).filter((f) => f.startsWith('svc-upload-')));
    const before = spills();
    const port = Number(new URL(h.url).port);
    const send = (head: string, body: Buffer | string, o: { cut?: number } = {}) =>
      new Promise<string>((resolve) => {
        const bytes = Buffer.from(body);
        const socket = net.connect(port, '127.0.0.1', () => {
          socket.write(
            `POST /api/v1/autonomy/voice/transcribe HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer ${KEYS.a}\r\n${head}Content-Length: ${bytes.length}\r\n\r\n`,
          );
          socket.write(o.cut ? bytes.subarray(0, o.cut) : bytes);
          if (o.cut) setTimeout(() => socket.destroy(), 100);
        });
        let answer = '';
        socket.on('data', (d) => (answer += d));
        socket.on('error', () => undefined);
        // a server that holds the connection: no answer (a refusal closes it at once; a busy machine may take a while)
        const held = setTimeout(() => socket.destroy(), 10_000);
        socket.on('close', () => (clearTimeout(held), resolve(answer.split('\r\n')[0] ?? '')));
      });
    const form = 'Content-Type: multipart/form-data; boundary=XB\r\n';
    // the form ends right after a part's headers: busboy breaks the part off before anyone listens
    for (const name of ['file', 'other'])
      expect(await send(form, `--XB\r\nContent-Disposition: form-data; name="${name}"; filename="a.wav"\r\n\r\n`)).to.contain('400');
    const part = (name: string, body: string | Buffer, filename = '') =>
      Buffer.concat([
        Buffer.from(`--XB\r\nContent-Disposition: form-data; name="${name}"${filename ? `; filename="${filename}"` : ''}\r\n\r\n`),
        Buffer.from(body),
        Buffer.from('\r\n'),
      ]);
    const end = Buffer.from('--XB--\r\n');
    const audio = wav(0.5);
    expect(await send(form, Buffer.concat([part('file', audio, 'a.wav'), part('file', audio, 'b.wav'), end]))).to.contain('400');
    const many = Array.from({ length: 33 }, (_, i) => part(`f${i}`, 'v'));
    expect(await send(form, Buffer.concat([part('file', audio, 'a.wav'), ...many, part('session_id', 'ses_x'), end]))).to.contain('400');
    // clients that go away inside the first 64 KB and after it, with a form and with a raw body
    const failedBefore = h.logs.filter((l) => l.includes('request failed')).length;
    const long = Buffer.concat([part('file', wav(5), 'a.wav'), end]);
    await send(form, long, { cut: 2000 });
    await send(form, long, { cut: 100_000 });
    await send('Content-Type: audio/wav\r\n', wav(5), { cut: 100_000 });
    await eventually(() => [...spills()].every((f) => before.has(f)) || null, 'every temporary upload file to be removed');
    expect(provider.received.filter((r) => r.file)).to.have.length(0);
    // and one that goes away while the provider works on its whole upload: no failure of the service, no error line
    provider.play(['hang']);
    const leaving = new AbortController();
    const asked = fetch(`${h.url}/api/v1/autonomy/voice/transcribe`, {
      method: 'POST',
      headers: { authorization: `Bearer ${KEYS.a}`, 'content-type': 'audio/wav' },
      body: wav(1),
      signal: leaving.signal,
    }).catch(() => null);
    await eventually(() => provider.received.length > 0 || null, 'the provider to be asked');
    leaving.abort();
    await asked;
    await eventually(() => h.logs.some((l) => l.includes('the client went away')) || null, 'the request to end');
    expect(h.logs.filter((l) => l.includes('request failed')).length).to.equal(failedBefore);
    expect((await raw(h, wav(0.2))).status, 'the service still answers').to.be.oneOf([200, 504]);
  });

  it('answers a form with a part it does not take, or past its size, before the rest of the body is sent', async () => {
    provider.play([]);
    const port = Number(new URL(h.url).port);
    /**
     * Sends a request's head, then its body a piece at a time (each once the last is handed to the kernel),
     * and stops as soon as the service answers: its status line, and how much of the body had gone by then.
     */
    const sendUntilAnswered = (head: string, pieces: Iterable<Buffer>) =>
      new Promise<{ status: string; sent: number }>((resolve) => {
        const socket = net.connect(port, '127.0.0.1');
        let answer = '';
        let sent = 0;
        let over = false;
        const finish = () => {
          if (over) return;
          over = true;
          clearTimeout(held);
          socket.destroy();
          resolve({ status: answer.split('\r\n')[0] ?? '', sent });
        };
        // a server that reads everything and still does not answer: the test says so rather than hang
        const held = setTimeout(finish, 20_000);
        socket.on('data', (d) => {
          answer += d;
          // the answer's head is all the test reads: a connection kept open after it is not waited for
          if (answer.includes('\r\n\r\n')) finish();
        });
        socket.on('error', () => undefined);
        socket.on('close', () => setTimeout(finish, 50));
        socket.on('connect', async () => {
          socket.write(`POST /api/v1/autonomy/voice/transcribe HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEYS.a}\r\n${head}\r\n`);
          for (const piece of pieces) {
            if (answer || over) break;
            await new Promise((r) => socket.write(piece, r));
            sent += piece.length;
            // a little time between pieces, for an answer to come back
            await new Promise((r) => setTimeout(r, 5));
          }
          // a whole body sent: the answer is waited for
        });
      });
    const part = (name: string, body: Buffer, filename = '') =>
      Buffer.concat([
        Buffer.from(`--XB\r\nContent-Disposition: form-data; name="${name}"${filename ? `; filename="${filename}"` : ''}\r\n\r\n`),
        body,
        Buffer.from('\r\n'),
      ]);
    const end = Buffer.from('--XB--\r\n');
    const pieces = function* (body: Buffer, size = 64 * 1024) {
      for (let at = 0; at < body.length; at += size) yield body.subarray(at, at + size);
    };
    const form = 'Content-Type: multipart/form-data; boundary=XB\r\n';
    const sized = (body: Buffer) => `${form}Content-Length: ${body.length}\r\n`;
    // a file part not named `file`, and a second file part after the audio: refused when announced
    const misnamed = Buffer.concat([part('audio', wav(100), 'a.wav'), end]);
    const second = Buffer.concat([part('file', wav(0.5), 'a.wav'), part('file', wav(100), 'b.wav'), end]);
    for (const [what, body] of [
      ['a file part named audio', misnamed],
      ['a second file part', second],
    ] as const) {
      const got = await sendUntilAnswered(sized(body), pieces(body));
      expect(got.status, what).to.contain('400');
      expect(got.sent, `${what}: answered before the whole body was sent`).to.be.below(body.length / 2);
    }
    // a field of 60 MB after the audio, in chunks of unannounced length: refused past the form's limit
    const huge = Buffer.concat([part('file', wav(0.5), 'a.wav'), part('prompt', Buffer.alloc(60 * 1024 * 1024, 'a')), end]);
    const chunked = function* () {
      for (const piece of pieces(huge, 1024 * 1024)) yield Buffer.concat([Buffer.from(`${piece.length.toString(16)}\r\n`), piece, Buffer.from('\r\n')]);
      yield Buffer.from('0\r\n\r\n');
    };
    const streamed = await sendUntilAnswered(`${form}Transfer-Encoding: chunked\r\n`, chunked());
    expect(streamed.status).to.contain('413');
    expect(streamed.sent, 'answered before the whole body was sent').to.be.below(40 * 1024 * 1024);
    // one that says its length up front is refused before a byte of its body is read
    const declared = await sendUntilAnswered(sized(huge), pieces(huge, 1024 * 1024));
    expect(declared.status).to.contain('413');
    expect(declared.sent).to.be.below(10 * 1024 * 1024);
    // so is a raw body that says its length is over the audio's limit: the provider hears none of it
    const rawDeclared = await sendUntilAnswered(`Content-Type: audio/wav\r\nContent-Length: ${huge.length}\r\n`, pieces(huge, 1024 * 1024));
    expect(rawDeclared.status).to.contain('413');
    expect(rawDeclared.sent).to.be.below(10 * 1024 * 1024);
    expect(provider.received.filter((r) => r.file)).to.have.length(0);
    provider.play([{ status: 200, body: VERBOSE }]);
    expect((await upload(h, formOf(wav(0.2), {}))).status, 'the service still answers').to.equal(200);
  });

  it('retries once after a 429, waiting as Retry-After says (capped)', async () => {
    provider.play([
      { status: 429, headers: { 'retry-after': '1' } },
      { status: 200, body: VERBOSE },
    ]);
    // big enough to be passed on while it arrives: the retry sends the same bytes again from the kept copy
    const audio = wav(8);
    const res = await raw(h, audio);
    expect(res.status, res.text).to.equal(200);
    expect(provider.received).to.have.length(2);
    expect(provider.received.every((r) => r.file!.bytes.equals(audio))).to.equal(true);
    expect(provider.received[1]!.at - provider.received[0]!.at).to.be.at.least(150);
  });

  it('answers 502 after a 500 twice, without the key or the provider body', async () => {
    provider.play([{ status: 500 }, { status: 500 }]);
    const res = await raw(h, wav(0.2));
    expect(res.status, res.text).to.equal(502);
    expect(res.body.code).to.equal('transcription-provider-error');
    expect(provider.received).to.have.length(2);
    expect(res.text).not.to.contain(KEY);
    expect(res.text).not.to.contain('leaked');
  });

  it('answers 504 when the provider does not answer in time', async () => {
    provider.play(['hang']);
    const res = await raw(h, wav(0.2));
    expect(res.status, res.text).to.equal(504);
    expect(res.body.code).to.equal('transcription-timeout');
  });

  it('answers an upload refused while it was passed on at once, even to a provider that has stopped reading it', async () => {
    provider.play(['stall']);
    // a WAV whose header promises 21 MB of samples (55 s), cut off after 20 MB: refused once its end is read,
    // while the provider, which read none of it, holds the transfer back
    const cut = wav(55, 192_000).subarray(0, 20 * 1024 * 1024);
    const started = Date.now();
    const res = await fetch(`${h.url}/api/v1/autonomy/voice/transcribe`, {
      method: 'POST',
      headers: { authorization: `Bearer ${KEYS.a}`, 'content-type': 'audio/wav' },
      body: cut,
      // no answer: the test says so rather than wait for the client to give up (it waited for good)
      signal: AbortSignal.timeout(15_000),
    });
    const body = (await res.json()) as Body;
    expect(res.status, JSON.stringify(body)).to.equal(422);
    expect(body.code).to.equal('audio-invalid');
    // the provider's 2 s timeout does not run while the upload is still arriving: the refusal came without it
    expect(Date.now() - started).to.be.below(12_000);
    expect(provider.received, 'the provider was asked').to.have.length(1);
  });

  it('refuses what is not audio, broken or too large before the provider sees it', async () => {
    provider.play([]);
    const text = await raw(h, Buffer.from('this is plainly text, not a recording'));
    expect(text.status, text.text).to.equal(415);
    expect(text.body.code).to.equal('unsupported-audio');

    const truncated = await raw(h, wav(1).subarray(0, 1000));
    expect(truncated.status, truncated.text).to.equal(422);
    expect(truncated.body.code).to.equal('audio-invalid');

    const empty = await raw(h, Buffer.alloc(0));
    expect(empty.status, empty.text).to.equal(422);
    expect(empty.body.code).to.equal('audio-invalid');

    const long = await raw(h, wav(61, 1000));
    expect(long.status, long.text).to.equal(422);
    expect(long.body.code).to.equal('audio-too-long');
    // the same minute with a byte rate that lies (it would look like a blink) is no WAV the service takes
    const lying = wav(61, 1000);
    lying.writeUInt32LE(0x7fffffff, 28);
    const lied = await raw(h, lying);
    expect(lied.status, lied.text).to.equal(422);
    expect(lied.body.code).to.equal('audio-invalid');
    // a UTF-16 text starts FF FE, two bytes of MPEG frame sync: no frame header follows, so no MP3
    const utf16 = Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from('name,amount\nacme,12\n'.repeat(200), 'utf16le')]);
    const csv = await raw(h, utf16);
    expect(csv.status, csv.text).to.equal(415);

    // a recorder's WAV of unknown length (sent as it is made: no Content-Length) plays 60 s in its first 1.9 MB:
    // refused then, not at 25 MB
    const huge = Buffer.alloc(26 * 1024 * 1024);
    wav(0).copy(huge);
    const unsized = async (bytes: Buffer, type: string) => {
      const res = await fetch(`${h.url}/api/v1/autonomy/voice/transcribe`, {
        method: 'POST',
        headers: { authorization: `Bearer ${KEYS.a}`, 'content-type': type },
        body: new Blob([bytes]).stream(),
        duplex: 'half',
      } as RequestInit);
      const text = await res.text();
      return { status: res.status, text, body: JSON.parse(text) };
    };
    const streamed = await unsized(huge, 'audio/wav');
    expect(streamed.status, streamed.text).to.equal(422);
    expect(streamed.body.code).to.equal('audio-too-long');
    // said up front, the same length is refused before the body is read
    const declared = await raw(h, huge);
    expect(declared.status, declared.text).to.equal(413);
    expect(declared.body.code).to.equal('payload-too-large');
    // a length only decoding tells (MP3): the size limit
    huge.write('ID3\x04', 0, 'latin1');
    const big = await unsized(huge, 'audio/mpeg');
    expect(big.status, big.text).to.equal(413);
    expect(big.body.code).to.equal('payload-too-large');
    const bigForm = await upload(h, formOf(huge, { language: 'en' }));
    expect(bigForm.status, bigForm.text).to.equal(413);
    expect(bigForm.body.code).to.equal('payload-too-large');

    const form = new FormData();
    form.append('file', new Blob([Buffer.from('PK\x03\x04zipped things here', 'latin1')], { type: 'audio/wav' }), 'file.wav');
    const zip = await upload(h, form);
    expect(zip.status, zip.text).to.equal(415);
    expect(zip.body.code).to.equal('unsupported-audio');

    expect(provider.received).to.have.length(0);
  });

  it("finds a WAV's length past any metadata before its data, counting every data chunk, before the provider is asked", async () => {
    provider.play([]);
    // 100 KB of JUNK first: the data header is past the 64 KB the format is judged by
    const junk = await raw(h, padded(wav(120, 1000), 100_000));
    expect(junk.status, junk.text).to.equal(422);
    expect(junk.body).to.deep.include({ code: 'audio-too-long', detail: 'the audio plays 120 s, over the 60 s limit' });
    // decoders play a second data chunk too: 30 s and 31 s
    const half = wav(30, 1000);
    const twice = await raw(h, riff(half.subarray(12, 36), half.subarray(36), chunk('data', Buffer.alloc(62_000))));
    expect(twice.status, twice.text).to.equal(422);
    expect(twice.body).to.deep.include({ code: 'audio-too-long', detail: 'the audio plays 61 s, over the 60 s limit' });
    expect(provider.live.bytes, 'the provider was not even asked').to.equal(0);
  });

  it('measures a compressed WAV by its blocks, whatever byte rate its header claims', async () => {
    provider.play([]);
    // IMA ADPCM: 8 bytes a sample, sixteen times the honest byte rate, would make 120 s look like 7.6
    const lying = await raw(h, imaAdpcm(120, 8000, { byteRate: 64_000 }));
    expect(lying.status, lying.text).to.equal(422);
    expect(lying.body).to.deep.include({ code: 'audio-too-long', detail: 'the audio plays 120 s, over the 60 s limit' });
    expect(provider.live.bytes, 'the provider was not even asked').to.equal(0);
  });

  it('breaks off an answer over 10 MB with a 502, and keeps no temporary file', async () => {
    const spills = () => new Set(fs.readdirSync(os.tmpdir()).filter((f) => f.startsWith('svc-upload-')));
    const before = spills();
    provider.play([{ status: 200, body: { ...VERBOSE, text: 'a'.repeat(11 * 1024 * 1024) } }]);
    const res = await raw(h, wav(0.5));
    expect(res.status, res.text.slice(0, 200)).to.equal(502);
    expect(res.body).to.deep.include({ code: 'transcription-provider-error', detail: 'the transcription provider answered more than 10 MB' });
    expect(provider.received, 'not asked again').to.have.length(1);
    await eventually(() => [...spills()].every((f) => before.has(f)) || null, 'every temporary upload file to be removed');
    provider.play([{ status: 200, body: VERBOSE }]);
    expect((await raw(h, wav(0.2))).status, 'the service still answers').to.equal(200);
  });

  it('takes a bounded number of uploads at once, a quarter of them per tenant, and tells the others when to come back', async () => {
    const heard = { text: 'hi', language: null, duration_seconds: 1, segments: [] };
    const transcriber: Transcriber = { name: 'fake', model: 'none', streams: false, transcribe: async (audio) => (await audio.settled, heard) };
    const voice = voiceOf({ log: h.rt.log }, { transcriber, unavailable: '', maxSeconds: 60, maxUploads: 8 });
    const audio = wav(3);
    const send = (tenant: string) => {
      const stream = new PassThrough();
      stream.write(audio.subarray(0, 80_000));
      const done = voice.transcribe(tenant, stream, { signal: new AbortController().signal, complete: async () => ({}) });
      return { stream, done };
    };
    const finish = async (u: ReturnType<typeof send>) => (u.stream.end(audio.subarray(80_000)), (await u.done).transcript.text);
    // a tenant holding its share (2 of 8) is told to wait; another tenant still gets in
    const acme = [send('acme'), send('acme')];
    expect(await send('acme').done.catch((e: unknown) => e)).to.deep.include({ code: 'rate-limited', retryAfterSeconds: 5 });
    const others = ['b', 'b', 'c', 'c', 'd', 'd'].map(send);
    // the process holds all it takes: everyone is told to come back
    expect(await send('e').done.catch((e: unknown) => e)).to.deep.include({ code: 'unavailable', retryAfterSeconds: 5 });
    expect(await finish(acme[0]!)).to.equal('hi');
    const next = send('acme');
    expect(await finish(next), 'a slot freed by an answer is taken again').to.equal('hi');
    for (const u of [acme[1]!, ...others]) expect(await finish(u)).to.equal('hi');
    // a refused upload held no slot: a tenant's whole share is free again
    const again = [send('acme'), send('acme')];
    for (const u of again) expect(await finish(u)).to.equal('hi');
  });

  it("appends the text to a session as a user message for one of its agents; another tenant's or an archived session is refused before the provider is asked", async () => {
    const session = (await h.call<Body>('POST', '/api/v1/sessions', { body: { title: 'spoken' } })).body;
    const agent = (await h.call<Body>('POST', `/api/v1/sessions/${session.id}/agents`, { body: { name: 'builder' } })).body;
    provider.play([{ status: 200, body: { ...VERBOSE, text: ' run the tests on main ' } }]);
    // fields an OpenAI client sends on its own are ignored
    const res = await upload(h, formOf(wav(0.5), { session_id: session.id, to: agent.id, model: 'whisper-1', response_format: 'json' }));
    expect(res.status, res.text).to.equal(200);
    expect(res.body.text).to.equal(' run the tests on main ');
    expect(res.body.message).to.deep.include({ session_id: session.id, role: 'user', to: agent.id, kind: 'text' });
    expect(res.body.message.parts).to.deep.equal([{ type: 'text', text: 'run the tests on main' }]);
    const inbox = (await h.call<Body>('GET', `/api/v1/sessions/${session.id}/messages`)).body.data;
    expect(inbox.map((m: Body) => m.id)).to.include(res.body.message.id);

    provider.play([]);
    const foreign = await raw(h, wav(0.5), 'audio/wav', { key: KEYS.b, query: `session_id=${session.id}` });
    expect(foreign.status, foreign.text).to.equal(404);
    const noAgent = await raw(h, wav(0.5), 'audio/wav', { query: `session_id=${session.id}&to=agt_${'0'.repeat(26)}` });
    expect(noAgent.status, noAgent.text).to.equal(404);
    expect((await h.call('DELETE', `/api/v1/sessions/${session.id}`)).status).to.be.oneOf([200, 202, 204]);
    const archived = await raw(h, wav(0.5), 'audio/wav', { query: `session_id=${session.id}` });
    expect(archived.status, archived.text).to.equal(409);
    expect(provider.received).to.have.length(0);
    const after = (await h.call<Body>('GET', `/api/v1/sessions/${session.id}/messages`)).body.data;
    expect(after).to.have.length(inbox.length);
  });

  it("sends no byte of a form's audio to the provider when a field before its file names another tenant's or an archived session", async () => {
    const session = (await h.call<Body>('POST', '/api/v1/sessions', { body: { title: 'not theirs' } })).body;
    // the fields first, as a client that builds its form so sends them: known before any of the audio
    const fieldsFirst = (fields: Record<string, string>) => {
      const form = new FormData();
      for (const [k, v] of Object.entries(fields)) form.append(k, v);
      form.append('file', new Blob([wav(10)], { type: 'audio/wav' }), 'note.wav');
      return form;
    };
    provider.play([]);
    const foreign = await upload(h, fieldsFirst({ session_id: session.id }), { key: KEYS.b });
    expect(foreign.status, foreign.text).to.equal(404);
    expect((await h.call('DELETE', `/api/v1/sessions/${session.id}`)).status).to.be.oneOf([200, 202, 204]);
    const archived = await upload(h, fieldsFirst({ session_id: session.id }));
    expect(archived.status, archived.text).to.equal(409);
    // bytes already on their way to the provider would land in a moment
    await new Promise((r) => setTimeout(r, 200));
    expect(provider.live.bytes, 'no byte of the audio reached the provider').to.equal(0);
    expect(provider.received).to.have.length(0);
  });

  it('starts an autonomy run with the text as its goal: 202 with Location, and the same key and audio return the same run', async () => {
    provider.play([
      { status: 200, body: { ...VERBOSE, text: 'open a pull request' } },
      { status: 200, body: { ...VERBOSE, text: 'open a pole request' } },
    ]);
    const audio = wav(0.7);
    mkdirSync(path.join(h.tenantDir(), 'voice'), { recursive: true });
    const first = await raw(h, audio, 'audio/wav', { query: 'run=true&workspace=voice', headers: { 'idempotency-key': 'voice-1' } });
    expect(first.status, first.text).to.equal(202);
    expect(first.headers.get('location')).to.equal(`/api/v1/runs/${first.body.run.run_id}`);
    expect(first.body.text).to.equal('open a pull request');
    expect(first.body.run).to.deep.include({ status: 'queued' });
    expect(first.body.run.run).to.deep.include({ kind: 'autonomy', goal: 'open a pull request', workspace: 'voice' });
    const stored = (await h.call<Body>('GET', `/api/v1/runs/${first.body.run.run_id}`)).body;
    expect(stored).to.deep.include({ goal: 'open a pull request', status: 'queued' });
    expect(stored.trigger).to.deep.include({ type: 'api' });

    // a retry of the same recording: the provider hears it differently, the run is still the first one
    const again = await raw(h, audio, 'audio/wav', { query: 'run=true&workspace=voice', headers: { 'idempotency-key': 'voice-1' } });
    expect(again.status, again.text).to.equal(202);
    expect(again.headers.get('idempotent-replayed')).to.equal('true');
    expect(again.body.run.run_id).to.equal(first.body.run.run_id);
    // another tenant cannot read it
    expect((await h.call('GET', `/api/v1/runs/${first.body.run.run_id}`, { key: KEYS.b })).status).to.equal(404);

    // with a session too: a retry posts no second message, even when the provider hears silence the second
    // time; another recording under the same key is refused and posts nothing
    const session = (await h.call<Body>('POST', '/api/v1/sessions', { body: { title: 'spoken runs' } })).body;
    const messages = async () => (await h.call<Body>('GET', `/api/v1/sessions/${session.id}/messages`)).body.data.length as number;
    const asked = (bytes: Buffer) =>
      raw(h, bytes, 'audio/wav', { query: `run=true&workspace=voice&session_id=${session.id}`, headers: { 'idempotency-key': 'voice-2' } });
    provider.play([
      { status: 200, body: { ...VERBOSE, text: 'deploy it' } },
      { status: 200, body: { ...VERBOSE, text: '', segments: [] } },
      { status: 200, body: { ...VERBOSE, text: 'something else' } },
    ]);
    const posted = await asked(audio);
    expect(posted.status, posted.text).to.equal(202);
    expect(await messages()).to.equal(1);
    const retried = await asked(audio);
    expect(retried.status, retried.text).to.equal(202);
    expect(retried.body.run.run_id).to.equal(posted.body.run.run_id);
    expect(await messages(), 'no second message').to.equal(1);
    const other = await asked(wav(0.9));
    expect(other.status).to.equal(422);
    expect(other.body.code).to.equal('idempotency-key-reused');
    expect(await messages(), 'nothing posted for a refused request').to.equal(1);
    // the key's earlier request is known before the provider has the whole recording: it is not paid for a 422
    await new Promise((r) => setTimeout(r, 200));
    expect(provider.received, 'the provider heard the first request and its retry, not the other recording').to.have.length(2);
    // nor for one whose key started a run of `POST /autonomy/run`
    const typed = await h.call<Body>('POST', '/api/v1/autonomy/run', {
      body: { goal: 'typed', workspace: 'voice' },
      headers: { 'idempotency-key': 'voice-3' },
    });
    expect(typed.status, typed.text).to.equal(202);
    const spoken = await raw(h, audio, 'audio/wav', { query: 'run=true&workspace=voice', headers: { 'idempotency-key': 'voice-3' } });
    expect(spoken.status, spoken.text).to.equal(422);
    expect(spoken.body.code).to.equal('idempotency-key-reused');
    await new Promise((r) => setTimeout(r, 200));
    expect(provider.received).to.have.length(2);
  });

  it('posts nothing, and starts nothing, when the transcript is longer than a message’s text or a goal may be', async () => {
    const session = (await h.call<Body>('POST', '/api/v1/sessions', { body: { title: 'long-winded' } })).body;
    const runsBefore = (await h.call<Body>('GET', '/api/v1/runs?limit=100')).body.data.length;
    // 100,001 characters: one more than a message part takes
    provider.play([{ status: 200, body: { ...VERBOSE, text: 'word '.repeat(20_000) + 'xy' } }]);
    const message = await raw(h, wav(0.5), 'audio/wav', { query: `session_id=${session.id}` });
    expect(message.status, message.text).to.equal(400);
    expect(message.body.detail).to.match(/too long to be a message/);
    // 20,001: one more than a goal takes
    provider.play([{ status: 200, body: { ...VERBOSE, text: 'a'.repeat(20_001) } }]);
    const run = await raw(h, wav(0.5), 'audio/wav', { query: `run=true&session_id=${session.id}` });
    expect(run.status, run.text).to.equal(400);
    expect(run.body.detail).to.match(/too long to be a run goal/);
    const messages = await h.call<Body>('GET', `/api/v1/sessions/${session.id}/messages`);
    expect(messages.status, messages.text).to.equal(200);
    expect(messages.body.data).to.deep.equal([]);
    expect((await h.call<Body>('GET', '/api/v1/runs?limit=100')).body.data).to.have.length(runsBefore);
    // the engine holds every caller to the limit, not only the API's schema
    const direct = await h.rt.engine.sessions
      .postMessage('tenant-a', session.id, { role: 'user', parts: [{ type: 'text', text: 'é'.repeat(100_001) }] })
      .catch((err: Error) => err);
    expect(String(direct)).to.match(/at most 100000 characters/);
    expect((await h.call<Body>('GET', `/api/v1/sessions/${session.id}/messages`)).body.data).to.deep.equal([]);
  });

  it('posts and starts nothing when no words are heard, and refuses option fields that are not valid', async () => {
    const before = (await h.call<Body>('GET', '/api/v1/runs?limit=100')).body.data.length;
    provider.play([{ status: 200, body: { ...VERBOSE, text: '  ', segments: [] } }]);
    const silent = await raw(h, wav(0.5), 'audio/wav', { query: 'run=true' });
    expect(silent.status, silent.text).to.equal(422);
    expect(silent.body.code).to.equal('audio-invalid');
    expect((await h.call<Body>('GET', '/api/v1/runs?limit=100')).body.data).to.have.length(before);

    provider.play([]);
    const badSession = await upload(h, formOf(wav(0.5), { session_id: 'not-a-session' }));
    expect(badSession.status, badSession.text).to.equal(400);
    expect(JSON.stringify(badSession.body.errors)).to.contain('/body/session_id');
    const badRun = await upload(h, formOf(wav(0.5), { run: 'maybe' }));
    expect(badRun.status, badRun.text).to.equal(400);
    const lonelyTo = await raw(h, wav(0.5), 'audio/wav', { query: `to=agt_${'0'.repeat(26)}` });
    expect(lonelyTo.status, lonelyTo.text).to.equal(400);
    const badQuery = await raw(h, wav(0.5), 'audio/wav', { query: 'run=perhaps' });
    expect(badQuery.status, badQuery.text).to.equal(400);
    expect(provider.received).to.have.length(0);
  });

  it("checks the length of formats whose header does not say by the provider's answer", async () => {
    provider.play([{ status: 200, body: { ...VERBOSE, duration: 61 } }]);
    const mp3 = Buffer.concat([Buffer.from('ID3\x04\x00\x00\x00\x00\x00\x00', 'latin1'), Buffer.alloc(2000)]);
    const res = await raw(h, mp3, 'audio/mpeg');
    expect(res.status, res.text).to.equal(422);
    expect(res.body).to.deep.include({ code: 'audio-too-long' });
    expect(provider.received[0]!.file!.mimeType).to.equal('audio/mpeg');
  });

  /** a service whose tenants' line holds one run, with no worker to empty it */
  const startFullLine = () =>
    startHarness({
      workers: false,
      env: {
        SERVICE_TENANT_MAX_RUNNING: '1',
        SERVICE_TENANT_MAX_WAITING: '1',
        SERVICE_TRANSCRIBE_PROVIDER: 'openai',
        SERVICE_TRANSCRIBE_BASE_URL: provider.url,
        SERVICE_TRANSCRIBE_API_KEY: KEY,
        SERVICE_TRANSCRIBE_MODEL: 'whisper-1',
        SERVICE_AGENT_BASE_URL: 'http://127.0.0.1:9/v1',
        SERVICE_AGENT_MODEL: 'none',
      },
    });

  it('refuses a spoken run with 429 before the provider is paid, while the tenant’s line is full (SERVICE_TENANT_MAX_WAITING)', async () => {
    const full = await startFullLine();
    try {
      for (let i = 0; i < 2; i++)
        expect((await full.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'message', args: { text: 'x' } }] } })).status).to.equal(202);
      provider.play([{ status: 200, body: VERBOSE }]);
      const res = await raw(full, wav(0.3), 'audio/wav', { query: 'run=true', headers: { 'idempotency-key': 'voice-full' } });
      expect(res.status, res.text).to.equal(429);
      expect(res.headers.get('retry-after')).to.equal('30');
      expect(provider.received, 'the provider was not asked').to.have.length(0);
    } finally {
      await full.close();
    }
  });

  it('posts no message for a spoken run refused because the line filled while the provider worked, and its retry posts it once', async () => {
    const full = await startFullLine();
    try {
      const session = (await full.call<Body>('POST', '/api/v1/sessions', { body: { title: 'spoken' } })).body;
      const messages = async () => (await full.call<Body>('GET', `/api/v1/sessions/${session.id}/messages`)).body.data as Body[];
      const run = () => full.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'message', args: { text: 'x' } }] } });
      expect((await run()).status).to.equal(202);
      provider.play([0, 1].map(() => ({ status: 200, body: { ...VERBOSE, text: 'deploy the service' }, delayMs: 400 })));
      const asked = () => raw(full, wav(0.3), 'audio/wav', { query: `run=true&session_id=${session.id}`, headers: { 'idempotency-key': 'voice-line' } });
      const first = asked();
      // the line fills while the provider works (the request was let in with room for one more)
      await eventually(async () => provider.live.bytes > 0 || null, 'the provider to be asked');
      const filler = await run();
      expect(filler.status).to.equal(202);
      const refused = await first;
      expect(refused.status, refused.text).to.equal(429);
      expect(await messages(), 'a refused spoken run posts nothing').to.deep.equal([]);
      // once there is room again, its retry with the same key starts the run and posts the message, once
      expect((await full.call('POST', `/api/v1/runs/${filler.body.run_id}/cancel`)).status).to.equal(200);
      const again = await asked();
      expect(again.status, again.text).to.equal(202);
      expect((await messages()).map((m) => m.parts[0].text)).to.deep.equal(['deploy the service']);
    } finally {
      await full.close();
    }
  });

  it('answers a retry of a spoken run with its first run (202, Idempotent-Replayed) after the line filled and its session was archived', async () => {
    const full = await startFullLine();
    try {
      const session = (await full.call<Body>('POST', '/api/v1/sessions', { body: { title: 'spoken' } })).body;
      const audio = wav(0.4);
      const asked = () => raw(full, audio, 'audio/wav', { query: `run=true&session_id=${session.id}`, headers: { 'idempotency-key': 'voice-retry' } });
      provider.play([0, 1, 2].map(() => ({ status: 200, body: { ...VERBOSE, text: 'tidy the repo' } })));
      const first = await asked();
      expect(first.status, first.text).to.equal(202);
      // the line is full now (the spoken run and one more): a new request would be refused with 429
      expect((await full.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'message', args: { text: 'x' } }] } })).status).to.equal(202);
      const whenFull = await asked();
      expect(whenFull.status, whenFull.text).to.equal(202);
      expect(whenFull.headers.get('idempotent-replayed')).to.equal('true');
      expect(whenFull.body.run.run_id).to.equal(first.body.run.run_id);
      // and its session archived since: a new request would be refused with 409
      expect((await full.call('DELETE', `/api/v1/sessions/${session.id}`)).status).to.be.oneOf([200, 202, 204]);
      const whenArchived = await asked();
      expect(whenArchived.status, whenArchived.text).to.equal(202);
      expect(whenArchived.headers.get('idempotent-replayed')).to.equal('true');
      expect(whenArchived.body.run.run_id).to.equal(first.body.run.run_id);
      // another tenant's key of the same name holds nothing of this one's
      const other = await raw(full, audio, 'audio/wav', {
        key: KEYS.b,
        query: `run=true&session_id=${session.id}`,
        headers: { 'idempotency-key': 'voice-retry' },
      });
      expect(other.status, other.text).to.equal(404);
    } finally {
      await full.close();
    }
  });

  it('posts a spoken run’s message once when the store refused its run the first time: the retry with its key gets the same message', async () => {
    const session = (await h.call<Body>('POST', '/api/v1/sessions', { body: { title: 'spoken, stored late' } })).body;
    const audio = wav(0.4);
    const asked = () => raw(h, audio, 'audio/wav', { query: `run=true&session_id=${session.id}`, headers: { 'idempotency-key': 'voice-store-refused' } });
    provider.play([0, 1].map(() => ({ status: 200, body: { ...VERBOSE, text: 'rotate the logs' } })));
    const insert = h.rt.store.runs.insert;
    h.rt.store.runs.insert = (async () => {
      throw Object.assign(new Error('database is locked'), { code: 'SQLITE_BUSY' });
    }) as typeof insert;
    let refused;
    try {
      refused = await asked();
    } finally {
      h.rt.store.runs.insert = insert;
    }
    expect(refused.status, refused.text).to.be.oneOf([500, 503]);
    const retried = await asked();
    expect(retried.status, retried.text).to.equal(202);
    const messages = (await h.call<Body>('GET', `/api/v1/sessions/${session.id}/messages`)).body.data as Body[];
    expect(
      messages.filter((m) => m.role === 'user').map((m) => m.parts[0].text),
      'the message once',
    ).to.deep.equal(['rotate the logs']);
    expect(retried.body.message.id).to.equal(messages.find((m) => m.role === 'user')!.id);
  });

  it('never writes the provider key to the logs', () => {
    expect(h.logs.join('\n')).not.to.contain(KEY);
  });

  it('answers 503 naming the variables when no provider is configured', async () => {
    const bare = await startHarness({ workers: false });
    try {
      const res = await raw(bare, wav(0.2));
      expect(res.status, res.text).to.equal(503);
      expect(res.body.code).to.equal('transcription-not-configured');
      expect(res.body.detail).to.contain('SERVICE_TRANSCRIBE_PROVIDER');
      // an operator's missing setting, logged as a refusal (a warning), not as a failure of the service with its stack
      const lines = bare.logs
        .join('')
        .split('\n')
        .filter((l) => l.includes(res.body.request_id))
        .map((l) => JSON.parse(l) as { level: number });
      expect(lines.length).to.be.greaterThan(0);
      expect(lines.map((l) => l.level).filter((level) => level >= 50)).to.deep.equal([]);
    } finally {
      await bare.close();
    }
  });
});
