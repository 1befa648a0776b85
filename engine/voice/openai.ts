// The `openai` provider: any OpenAI-compatible POST {base}/audio/transcriptions, asked for verbose_json.
// The upload is passed on as it arrives (the provider's transfer overlaps the client's); one retry on
// 429/5xx (honouring Retry-After, capped) sends the kept bytes again. The key and the provider's body
// never leave here.
import { randomBytes } from 'node:crypto';
import http from 'node:http';
import https from 'node:https';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { TranscriptionFailedError, wellFormed } from '../platform/index.js';
import type { Transcriber, TranscriberAudio, TranscriberOptions, TranscriberResult } from './transcriber.js';

export type OpenAiTranscriberSettings = {
  baseUrl: string;
  apiKey: string;
  model: string;
  /** the whole call, retry included */
  timeoutMs?: number;
  /** the longest wait before the retry, whatever Retry-After says */
  maxRetryDelayMs?: number;
};

const DEFAULT_TIMEOUT_MS = 60_000;
const DEFAULT_MAX_RETRY_DELAY_MS = 10_000;
const DEFAULT_RETRY_DELAY_MS = 1_000;
/** The largest answer read: a transcript of 25 MB of audio, segments and all, is far smaller. */
const MAX_ANSWER_BYTES = 10 * 1024 * 1024;

type VerboseJson = {
  text?: unknown;
  language?: unknown;
  duration?: unknown;
  segments?: { start?: unknown; end?: unknown; text?: unknown }[];
};

export function openAiTranscriber(s: OpenAiTranscriberSettings): Transcriber {
  const endpoint = new URL(`${s.baseUrl.replace(/\/+$/, '')}/audio/transcriptions`);
  const timeoutMs = s.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  const maxDelayMs = s.maxRetryDelayMs ?? DEFAULT_MAX_RETRY_DELAY_MS;

  /**
   * The form, written as the upload arrives: the file first, then the fields only known once it has
   * (a client's form may send them after its file). Field order does not matter to the protocol.
   */
  async function* form(audio: TranscriberAudio, boundary: string): AsyncGenerator<Buffer> {
    const field = (name: string, value: string) => Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="${name}"\r\n\r\n${value}\r\n`, 'utf8');
    yield field('model', s.model);
    yield field('response_format', 'verbose_json');
    const extension = audio.format === 'mp3' ? 'mp3' : audio.format === 'mp4' ? 'm4a' : audio.format;
    yield Buffer.from(
      `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="audio.${extension}"\r\nContent-Type: ${audio.mimeType}\r\n\r\n`,
      'latin1',
    );
    yield* audio.body();
    yield Buffer.from('\r\n');
    const terms = await audio.settled;
    if (terms.language) yield field('language', terms.language);
    if (terms.prompt) yield field('prompt', terms.prompt);
    yield Buffer.from(`--${boundary}--\r\n`);
  }

  async function transcribe(audio: TranscriberAudio, opts: TranscriberOptions): Promise<TranscriberResult> {
    // the provider's time starts once the upload is all here: a slow client is not the provider's fault
    const timeout = new AbortController();
    // an upload refused as it arrives ends the provider's request at once: one that has stopped reading holds
    // the transfer back, and the refusal (known already) waited for it for good
    const refused = new AbortController();
    let timer: NodeJS.Timeout | undefined;
    let done = false;
    audio.settled.then(
      () => {
        if (!done) timer = setTimeout(() => timeout.abort(), timeoutMs);
      },
      () => refused.abort(),
    );
    const signal = AbortSignal.any([opts.signal, timeout.signal, refused.signal]);
    const failed = (err: unknown): Error => {
      if (timeout.signal.aborted)
        return new TranscriptionFailedError('transcription-timeout', `the transcription provider did not answer within ${timeoutMs} ms`);
      if (opts.signal.aborted) return err as Error;
      if (audio.failure) return audio.failure;
      if (err instanceof TranscriptionFailedError) return err;
      return new TranscriptionFailedError('transcription-provider-error', 'the transcription provider could not be reached', { cause: (err as Error).name });
    };
    try {
      for (let attempt = 1; ; attempt++) {
        let res: Answer;
        try {
          // a retry reads the upload from its file: it asks once that is whole, not holding the provider's request
          // open and idle while the client sends the rest (a proxy in front of the provider closes such a request)
          if (attempt > 1) await audio.settled;
          const boundary = `----transcribe${randomBytes(16).toString('hex')}`;
          res = await post(
            endpoint,
            { authorization: `Bearer ${s.apiKey}`, 'content-type': `multipart/form-data; boundary=${boundary}` },
            form(audio, boundary),
            signal,
          );
        } catch (err) {
          throw failed(err);
        }
        if (res.status >= 200 && res.status < 300) return parse(res.body);
        const again = res.status === 429 || res.status >= 500;
        if (!again || attempt >= 2)
          throw new TranscriptionFailedError('transcription-provider-error', `the transcription provider answered ${res.status}`, {
            provider_status: res.status,
            attempts: attempt,
          });
        try {
          await sleep(retryDelayMs(res.retryAfter, maxDelayMs), undefined, { signal });
        } catch (err) {
          throw failed(err);
        }
      }
    } finally {
      done = true;
      clearTimeout(timer);
    }
  }

  return { name: 'openai', model: s.model, streams: true, transcribe };
}

type Answer = { status: number; retryAfter: string | null; body: Buffer };

/** Connections to the provider are kept for the next transcription. */
const agents = { 'http:': new http.Agent({ keepAlive: true }), 'https:': new https.Agent({ keepAlive: true }) };

/**
 * POSTs `body` as it is produced, with node's own client (fetch would pass each chunk through web
 * streams, which costs more than the transfer). A body that throws breaks the request off; an answer
 * over MAX_ANSWER_BYTES is broken off unread. Nothing in the listeners can throw: the caller decodes.
 */
function post(url: URL, headers: Record<string, string>, body: AsyncIterable<Buffer>, signal: AbortSignal): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const client = url.protocol === 'https:' ? https : http;
    const source = Readable.from(body);
    const req = client.request(url, { method: 'POST', headers, signal, agent: agents[url.protocol as 'http:' | 'https:'] }, (res) => {
      const chunks: Buffer[] = [];
      let bytes = 0;
      res.on('data', (c: Buffer) => {
        bytes += c.length;
        if (bytes <= MAX_ANSWER_BYTES) {
          chunks.push(c);
          return;
        }
        chunks.length = 0;
        source.destroy();
        res.destroy();
        reject(
          new TranscriptionFailedError('transcription-provider-error', `the transcription provider answered more than ${MAX_ANSWER_BYTES / 1024 / 1024} MB`),
        );
      });
      res.once('end', () => {
        // an answer before the upload was all sent (a 429, say) ends this transfer: nothing more is taken for it
        source.destroy();
        resolve({ status: res.statusCode ?? 0, retryAfter: [res.headers['retry-after']].flat()[0] ?? null, body: Buffer.concat(chunks) });
      });
      res.on('error', reject);
    });
    req.once('error', reject);
    // a provider may answer before it has read the upload: the answer counts, not the broken pipe
    pipeline(source, req).catch(reject);
  });
}

/** Retry-After in seconds (an HTTP date is read too), capped; a second by default. */
function retryDelayMs(header: string | null, maxMs: number): number {
  let ms = DEFAULT_RETRY_DELAY_MS;
  if (header && /^\d+(\.\d+)?$/.test(header.trim())) ms = Number(header) * 1000;
  else if (header && !Number.isNaN(Date.parse(header))) ms = Date.parse(header) - Date.now();
  return Math.min(Math.max(0, ms), maxMs);
}

function parse(body: Buffer): TranscriberResult {
  let json: VerboseJson;
  try {
    json = JSON.parse(body.toString('utf8')) as VerboseJson;
  } catch {
    throw new TranscriptionFailedError('transcription-provider-error', 'the transcription provider answered something that is not JSON');
  }
  if (typeof json?.text !== 'string') throw new TranscriptionFailedError('transcription-provider-error', 'the transcription provider answered no text');
  // a time is never negative; a text is well-formed Unicode (a lone surrogate made an answer strict readers refuse)
  const num = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) && v >= 0 ? v : null);
  return wellFormed({
    text: json.text,
    language: typeof json.language === 'string' ? json.language : null,
    duration_seconds: num(json.duration),
    segments: (Array.isArray(json.segments) ? json.segments : []).map((seg) => ({
      start: num(seg?.start) ?? 0,
      end: num(seg?.end) ?? 0,
      text: typeof seg?.text === 'string' ? seg.text : '',
    })),
  });
}
