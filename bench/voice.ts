// Voice transcription: the service's own cost on a 10 MB upload. The same multipart request is posted,
// one at a time and alternately, to the service (whose openai provider is the scripted server below)
// and straight to the scripted server; the difference of the medians is what the service adds.
import type { ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { deleteRedisPrefix, uniquePrefix } from '../test/support/harness.js';
import { BENCH_KEY, serviceEnv, startServer, stop } from './http.js';

const UPLOAD_BYTES = 10 * 1024 * 1024;
const ROUNDS = Number(process.env.BENCH_VOICE_ROUNDS ?? 100);

/** A 16 kHz mono 16-bit WAV of `bytes` in all (about 327 s for 10 MB: under the 600 s limit). */
function wav(bytes: number): Buffer {
  const data = bytes - 44;
  const b = Buffer.alloc(bytes);
  b.write('RIFF', 0, 'latin1');
  b.writeUInt32LE(bytes - 8, 4);
  b.write('WAVEfmt ', 8, 'latin1');
  b.writeUInt32LE(16, 16);
  b.writeUInt16LE(1, 20);
  b.writeUInt16LE(1, 22);
  b.writeUInt32LE(16_000, 24);
  b.writeUInt32LE(32_000, 28);
  b.writeUInt16LE(2, 32);
  b.writeUInt16LE(16, 34);
  b.write('data', 36, 'latin1');
  b.writeUInt32LE(data, 40);
  for (let i = 44; i + 1 < bytes; i += 2) b.writeInt16LE(Math.round(8000 * Math.sin(i / 20)), i);
  return b;
}

async function post(url: string, audio: Buffer, headers: Record<string, string>): Promise<number> {
  const form = new FormData();
  form.append('file', new Blob([audio], { type: 'audio/wav' }), 'speech.wav');
  form.append('model', 'whisper-1');
  const started = performance.now();
  const res = await fetch(url, { method: 'POST', headers, body: form });
  await res.arrayBuffer();
  const ms = performance.now() - started;
  if (res.status !== 200) throw new Error(`${url} answered ${res.status}`);
  return ms;
}

const pct = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))]!;

export async function voiceOverhead(): Promise<string[]> {
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-bench-voice-'));
  const prefix = uniquePrefix();
  const servers: ChildProcess[] = [];
  try {
    const provider = await startServer('bench/servers/transcribe-provider.ts', {});
    servers.push(provider.child);
    const web = await startServer('api/main.ts', {
      ...serviceEnv(dataDir, prefix),
      SERVICE_TRANSCRIBE_PROVIDER: 'openai',
      SERVICE_TRANSCRIBE_BASE_URL: `${provider.url}/v1`,
      SERVICE_TRANSCRIBE_API_KEY: 'sk-bench',
    });
    servers.push(web.child);
    process.stderr.write(`bench: POST /api/v1/autonomy/voice/transcribe, ${UPLOAD_BYTES / 1024 / 1024} MB, ${ROUNDS} rounds\n`);
    const audio = wav(UPLOAD_BYTES);
    const service: number[] = [];
    const direct: number[] = [];
    const viaService = () => post(`${web.url}/api/v1/autonomy/voice/transcribe`, audio, { authorization: `Bearer ${BENCH_KEY}` });
    const straight = () => post(`${provider.url}/v1/audio/transcriptions`, audio, { authorization: 'Bearer sk-bench' });
    for (let i = 0; i < 5; i++) await viaService().then(straight);
    for (let i = 0; i < ROUNDS; i++) {
      // alternate which goes first, so neither always meets a warm or a cold cache
      if (i % 2) {
        service.push(await viaService());
        direct.push(await straight());
      } else {
        direct.push(await straight());
        service.push(await viaService());
      }
    }
    const [s50, d50, s99, d99] = [pct(service, 50), pct(direct, 50), pct(service, 99), pct(direct, 99)];
    return [
      `| 10 MB WAV, multipart, p50 | ${s50.toFixed(1)} ms | ${d50.toFixed(1)} ms straight to the provider | +${(s50 - d50).toFixed(1)} ms (goal <= +20) |`,
      `| 10 MB WAV, multipart, p99 | ${s99.toFixed(1)} ms | ${d99.toFixed(1)} ms | +${(s99 - d99).toFixed(1)} ms |`,
    ];
  } finally {
    await Promise.all(servers.map(stop));
    await deleteRedisPrefix(prefix);
    await fs.rm(dataDir, { recursive: true, force: true });
  }
}
