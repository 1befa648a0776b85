// The `openai` provider: any OpenAI-compatible POST {base}/audio/transcriptions, asked for verbose_json.
// One retry on 429/5xx (honouring Retry-After, capped); the key and the provider's body never leave here.
import { setTimeout as sleep } from 'node:timers/promises';
import { TranscriptionFailedError } from '../platform/index.js';
import { AUDIO_MIME } from './audio.js';
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

type VerboseJson = {
  text?: unknown;
  language?: unknown;
  duration?: unknown;
  segments?: { start?: unknown; end?: unknown; text?: unknown }[];
};

export function openAiTranscriber(s: OpenAiTranscriberSettings): Transcriber {
  const endpoint = `${s.baseUrl.replace(/\/+$/, '')}/audio/transcriptions`;
  const timeoutMs = s.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  const maxDelayMs = s.maxRetryDelayMs ?? DEFAULT_MAX_RETRY_DELAY_MS;

  function form(audio: TranscriberAudio, opts: TranscriberOptions): FormData {
    const f = new FormData();
    f.append('file', new Blob([audio.bytes], { type: AUDIO_MIME[audio.format] }), audio.filename);
    f.append('model', s.model);
    f.append('response_format', 'verbose_json');
    if (opts.language) f.append('language', opts.language);
    if (opts.prompt) f.append('prompt', opts.prompt);
    return f;
  }

  async function transcribe(audio: TranscriberAudio, opts: TranscriberOptions): Promise<TranscriberResult> {
    const timeout = AbortSignal.timeout(timeoutMs);
    const signal = AbortSignal.any([opts.signal, timeout]);
    const failed = (err: unknown): Error => {
      if (timeout.aborted) return new TranscriptionFailedError('transcription-timeout', `the transcription provider did not answer within ${timeoutMs} ms`);
      if (opts.signal.aborted) return err as Error;
      return new TranscriptionFailedError('transcription-provider-error', 'the transcription provider could not be reached', { cause: (err as Error).name });
    };
    for (let attempt = 1; ; attempt++) {
      let res: Response;
      let body: string;
      try {
        res = await fetch(endpoint, { method: 'POST', headers: { authorization: `Bearer ${s.apiKey}` }, body: form(audio, opts), signal });
        body = await res.text();
      } catch (err) {
        throw failed(err);
      }
      if (res.ok) return parse(body);
      const again = res.status === 429 || res.status >= 500;
      if (!again || attempt >= 2)
        throw new TranscriptionFailedError('transcription-provider-error', `the transcription provider answered ${res.status}`, {
          provider_status: res.status,
          attempts: attempt,
        });
      try {
        await sleep(retryDelayMs(res.headers.get('retry-after'), maxDelayMs), undefined, { signal });
      } catch (err) {
        throw failed(err);
      }
    }
  }

  return { name: 'openai', model: s.model, transcribe };
}

/** Retry-After in seconds (an HTTP date is read too), capped; a second by default. */
function retryDelayMs(header: string | null, maxMs: number): number {
  let ms = DEFAULT_RETRY_DELAY_MS;
  if (header && /^\d+(\.\d+)?$/.test(header.trim())) ms = Number(header) * 1000;
  else if (header && !Number.isNaN(Date.parse(header))) ms = Date.parse(header) - Date.now();
  return Math.min(Math.max(0, ms), maxMs);
}

function parse(body: string): TranscriberResult {
  let json: VerboseJson;
  try {
    json = JSON.parse(body) as VerboseJson;
  } catch {
    throw new TranscriptionFailedError('transcription-provider-error', 'the transcription provider answered something that is not JSON');
  }
  if (typeof json?.text !== 'string') throw new TranscriptionFailedError('transcription-provider-error', 'the transcription provider answered no text');
  const num = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) ? v : null);
  return {
    text: json.text,
    language: typeof json.language === 'string' ? json.language : null,
    duration_seconds: num(json.duration),
    segments: (Array.isArray(json.segments) ? json.segments : []).map((seg) => ({
      start: num(seg?.start) ?? 0,
      end: num(seg?.end) ?? 0,
      text: typeof seg?.text === 'string' ? seg.text : '',
    })),
  };
}
