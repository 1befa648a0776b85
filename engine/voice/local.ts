// The `local` provider: an offline engine on this machine, for air-gapped use. The upload is decoded to
// 16 kHz mono PCM by ffmpeg (any format) or sox (WAV, FLAC, Ogg Vorbis), then recognised by CMU
// pocketsphinx with its US English model. Both run in the tool sandbox (no network, nothing of the
// service's but a temporary folder holding this one upload), since a decoder reads untrusted bytes.
// Recognition takes a core per transcription: at most `concurrency` run at once, the rest wait, tenants in turn.
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { AudioRejectedError, tempPrefix, TranscriptionFailedError, ValidationError } from '../platform/index.js';
import { runProcess, which, type ProcessResult, type Sandbox } from '../tools/index.js';
import type { Transcriber, TranscriberAudio, TranscriberOptions, TranscriberResult, TranscriptSegment } from './transcriber.js';

export const LOCAL_MODEL = 'pocketsphinx-en-us';
const SAMPLE_RATE = 16_000;
const BYTES_PER_SECOND = SAMPLE_RATE * 2;
const OUTPUT_MAX_BYTES = 256 * 1024;
const DEFAULT_TIMEOUT_MS = 300_000;

export type LocalPrograms = { decoder: { kind: 'ffmpeg' | 'sox'; path: string }; recognizer: string };

export type LocalTranscriberSettings = {
  programs: LocalPrograms;
  sandbox: Sandbox;
  /** the environment the programs get (PATH and the like, never the service's secrets) */
  env: Record<string, string>;
  /** decoding and recognition together */
  timeoutMs?: number;
  concurrency?: number;
};

/** The programs the local provider needs, found on PATH, or what is missing and how to install it. */
export function findLocalPrograms(pathVar: string | undefined): { programs: LocalPrograms } | { missing: string } {
  const recognizer = which('pocketsphinx_continuous', pathVar);
  const ffmpeg = which('ffmpeg', pathVar);
  const sox = which('sox', pathVar);
  const decoder = ffmpeg ? { kind: 'ffmpeg' as const, path: ffmpeg } : sox ? { kind: 'sox' as const, path: sox } : null;
  if (recognizer && decoder) return { programs: { decoder, recognizer } };
  const lacking = [...(recognizer ? [] : ['pocketsphinx_continuous']), ...(decoder ? [] : ['ffmpeg or sox'])];
  return { missing: `${lacking.join(' and ')} not found on PATH (apt-get install pocketsphinx pocketsphinx-en-us ffmpeg)` };
}

/** The formats sox reads without extra packages; ffmpeg reads all of them. */
const SOX_READS = new Set(['wav', 'flac', 'ogg']);

export function localTranscriber(s: LocalTranscriberSettings): Transcriber {
  const timeoutMs = s.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  const slots = semaphore(s.concurrency ?? Math.max(1, os.availableParallelism()));
  const { decoder, recognizer } = s.programs;

  function decodeArgv(input: string, maxSeconds: number): string[] {
    // one second over the limit is enough to tell that it is over
    const keep = String(maxSeconds + 1);
    return decoder.kind === 'ffmpeg'
      ? [
          decoder.path,
          '-nostdin',
          '-hide_banner',
          '-loglevel',
          'error',
          '-i',
          input,
          '-t',
          keep,
          '-vn',
          '-ac',
          '1',
          '-ar',
          String(SAMPLE_RATE),
          '-f',
          's16le',
          '-y',
          'audio.raw',
        ]
      : // -D: no dither (sox adds random noise when it lowers the bit depth, so a clip transcribed twice could
        // read differently)
        [
          decoder.path,
          '-D',
          '-q',
          input,
          '-t',
          'raw',
          '-r',
          String(SAMPLE_RATE),
          '-c',
          '1',
          '-b',
          '16',
          '-e',
          'signed-integer',
          'audio.raw',
          'trim',
          '0',
          keep,
        ];
  }

  async function transcribe(audio: TranscriberAudio, opts: TranscriberOptions): Promise<TranscriberResult> {
    const { language } = await audio.settled;
    if (language && !/^en\b/i.test(language))
      throw new ValidationError('the local provider transcribes English only', [
        { path: '/body/language', message: 'must be "en" (or unset) with the local provider' },
      ]);
    if (decoder.kind === 'sox' && !SOX_READS.has(audio.format))
      throw new AudioRejectedError(
        'unsupported-audio',
        `the local provider decodes ${audio.format} with ffmpeg, which is not installed (sox reads WAV, FLAC and Ogg Vorbis)`,
      );
    // timers of our own: AbortSignal.timeout's, held only weakly by AbortSignal.any, can be collected
    // before it fires (Node 20), and the recognition then runs unbounded. The wait for a core is bounded
    // apart from the work: a burst of uploads that queue spends none of the time each has to be decoded and
    // recognised
    const waited = new AbortController();
    let timer = setTimeout(() => waited.abort(), timeoutMs);
    const release = await slots.acquire(opts.tenantId ?? '', AbortSignal.any([opts.signal, waited.signal])).catch(() => {
      clearTimeout(timer);
      if (opts.signal.aborted) throw ended(opts.signal, timeoutMs);
      throw new TranscriptionFailedError('transcription-timeout', `no local recogniser was free within ${timeoutMs} ms (they were all busy)`);
    });
    clearTimeout(timer);
    const timeout = new AbortController();
    timer = setTimeout(() => timeout.abort(), timeoutMs);
    const deadline = AbortSignal.any([opts.signal, timeout.signal]);
    let dir: string | undefined;
    try {
      dir = await fs.mkdtemp(tempPrefix('transcribe'));
      const input = `in.${audio.format}`;
      await audio.saveAs(path.join(dir, input));
      const workspace = dir;
      const run = (argv: string[]) => runProcess(s.sandbox, argv, { workspace, env: s.env, network: false, signal: deadline, maxBytes: OUTPUT_MAX_BYTES });

      const decoded = await run(decodeArgv(input, opts.maxSeconds));
      if (decoded.aborted) throw ended(opts.signal, timeoutMs);
      if (decoded.exit_code === 127) throw programMissing(decoded);
      const pcmBytes = await fs.stat(path.join(dir, 'audio.raw')).then(
        (st) => st.size,
        () => 0,
      );
      // past the sandbox's CPU or memory limit: what the upload made the decoder do (422, as audio it cannot decode);
      // killed otherwise (a crash): the service failed, not the audio
      if (decoded.cpu_exceeded || decoded.out_of_memory)
        throw new AudioRejectedError('audio-invalid', `the ${audio.format} audio could not be decoded within ${describeEnd(decoded)}`, {
          decoder: decoder.kind,
        });
      if (decoded.signal)
        throw new TranscriptionFailedError('transcription-provider-error', `the local decoder (${decoder.kind}) ended by ${describeEnd(decoded)}`);
      if (decoded.exit_code !== 0 || pcmBytes === 0)
        throw new AudioRejectedError('audio-invalid', `the ${audio.format} audio cannot be decoded`, { decoder: decoder.kind });
      const seconds = pcmBytes / BYTES_PER_SECOND;
      if (seconds > opts.maxSeconds)
        throw new AudioRejectedError('audio-too-long', `the audio plays over ${opts.maxSeconds} s, the limit`, { max_seconds: opts.maxSeconds });

      const recognized = await run([recognizer, '-infile', 'audio.raw', '-samprate', String(SAMPLE_RATE), '-time', 'yes', '-logfn', '/dev/null']);
      if (recognized.aborted) throw ended(opts.signal, timeoutMs);
      if (recognized.exit_code === 127) throw programMissing(recognized);
      if (recognized.exit_code !== 0)
        throw new TranscriptionFailedError('transcription-provider-error', `the local recogniser exited with ${recognized.exit_code ?? recognized.signal}`);
      const segments = parseTimedOutput(recognized.stdout);
      return { text: segments.map((x) => x.text).join(' '), language: 'en', duration_seconds: seconds, segments };
    } finally {
      clearTimeout(timer);
      release();
      if (dir) await fs.rm(dir, { recursive: true, force: true });
    }
  }

  return { name: 'local', model: LOCAL_MODEL, streams: false, transcribe };
}

function ended(caller: AbortSignal, timeoutMs: number): Error {
  if (caller.aborted) return caller.reason instanceof Error ? caller.reason : new Error('the request was aborted');
  return new TranscriptionFailedError('transcription-timeout', `the local transcription did not finish within ${timeoutMs} ms`);
}

/** How a program that did not exit by itself ended, in words. */
const describeEnd = (r: ProcessResult) =>
  r.out_of_memory ? "the sandbox's memory limit" : r.cpu_exceeded ? "the sandbox's CPU time limit" : `signal ${r.signal}`;

function programMissing(r: ProcessResult): Error {
  return new TranscriptionFailedError('transcription-provider-error', 'a program of the local provider could not be started', {
    reason: r.stderr.trim().split('\n').pop(),
  });
}

/** Filler pocketsphinx reports between words. */
const NOT_WORDS = new Set(['<s>', '</s>', '<sil>']);

/**
 * pocketsphinx_continuous -time yes prints, per utterance, the hypothesis, then one line per word:
 * `word start end confidence`, opened by `<s>` and closed by `</s>`. Alternative pronunciations carry a
 * `(2)` suffix; noise is `[NOISE]`-like. One segment per utterance, timed by its words.
 */
export function parseTimedOutput(stdout: string): TranscriptSegment[] {
  const segments: TranscriptSegment[] = [];
  let words: { word: string; start: number; end: number }[] = [];
  const flush = () => {
    if (words.length) segments.push({ start: words[0]!.start, end: words.at(-1)!.end, text: words.map((w) => w.word).join(' ') });
    words = [];
  };
  for (const line of stdout.split('\n')) {
    const m = /^(\S+) (\d+(?:\.\d+)?) (\d+(?:\.\d+)?) (-?\d+(?:\.\d+)?)$/.exec(line.trim());
    if (!m) continue;
    const token = m[1]!;
    if (token === '<s>') flush();
    if (token === '</s>') {
      flush();
      continue;
    }
    if (NOT_WORDS.has(token) || /^[[(+].*[\])+]$/.test(token)) continue;
    words.push({ word: token.replace(/\(\d+\)$/, ''), start: Number(m[2]), end: Number(m[3]) });
  }
  flush();
  return segments;
}

/** The idle tenants whose last turn a local transcriber keeps (see semaphore). */
const SERVED_KEPT = 10_000;

/**
 * At most `n` holders at once; a waiter gives up when its signal aborts. A place that frees goes to the
 * waiting tenant served longest ago (one never served first), each tenant's own waiters in their order: a
 * tenant with many uploads in line waits behind one upload of each other tenant, never the reverse.
 */
function semaphore(n: number) {
  let free = n;
  const waiting = new Map<string, (() => void)[]>();
  /** places held by tenant, and the turn of each one's last grant, oldest first */
  const holding = new Map<string, number>();
  const served = new Map<string, number>();
  /** the turn a tenant not in `served` counts as served at: the latest of those let go, older than any kept */
  let floor = 0;
  let turn = 0;
  const servedAt = (tenant: string) => served.get(tenant) ?? floor;
  const grantTo = (tenant: string) => {
    holding.set(tenant, (holding.get(tenant) ?? 0) + 1);
    served.delete(tenant);
    served.set(tenant, ++turn);
    return once(() => release(tenant));
  };
  /**
   * Kept while a tenant is idle too: forgotten as soon as it was, a tenant that sends one upload at a time came
   * back as never served and went first each time, every other place. Past SERVED_KEPT tenants, the idle ones
   * served longest ago are let go.
   */
  const forget = () => {
    for (const [t, at] of served) {
      if (served.size <= SERVED_KEPT) return;
      if (holding.has(t) || waiting.has(t)) continue;
      served.delete(t);
      floor = at;
    }
  };
  const release = (tenant: string) => {
    const held = holding.get(tenant)! - 1;
    if (held) holding.set(tenant, held);
    else holding.delete(tenant);
    forget();
    let next: string | undefined;
    for (const t of waiting.keys()) if (next === undefined || servedAt(t) < servedAt(next)) next = t;
    if (next === undefined) {
      free++;
      return;
    }
    const line = waiting.get(next)!;
    const grant = line.shift()!;
    if (!line.length) waiting.delete(next);
    grant();
  };
  return {
    acquire(tenant: string, signal: AbortSignal): Promise<() => void> {
      if (free > 0) {
        free--;
        return Promise.resolve(grantTo(tenant));
      }
      return new Promise((resolve, reject) => {
        const grant = () => {
          signal.removeEventListener('abort', give);
          resolve(grantTo(tenant));
        };
        const give = () => {
          const line = waiting.get(tenant);
          if (line) {
            line.splice(line.indexOf(grant), 1);
            if (!line.length) waiting.delete(tenant);
          }
          reject(signal.reason);
        };
        if (signal.aborted) return reject(signal.reason);
        const line = waiting.get(tenant);
        if (line) line.push(grant);
        else waiting.set(tenant, [grant]);
        signal.addEventListener('abort', give, { once: true });
      });
    },
  };
}

function once(fn: () => void): () => void {
  let done = false;
  return () => {
    if (done) return;
    done = true;
    fn();
  };
}
