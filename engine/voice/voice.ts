// Transcribes one upload: checks what it is before any provider sees it, and keeps nothing. One log line
// per transcription, with sizes and timings, never the text.
import { performance } from 'node:perf_hooks';
import type { Readable } from 'node:stream';
import { admission, AudioRejectedError, TranscriptionNotConfiguredError, type Logger } from '../platform/index.js';
import { AudioUpload, type UploadTerms } from './upload.js';
import type { Transcriber } from './transcriber.js';

/** The largest upload taken (the OpenAI API's own limit). */
export const MAX_AUDIO_BYTES = 25 * 1024 * 1024;
/**
 * Uploads a process takes at once, from their first byte to the answer: each keeps a temporary file of up to
 * 25 MB (and, for a provider that streams, what it has not taken yet in memory). One more is answered 503
 * with Retry-After before its body is read. One tenant holds at most a quarter of them (429 past that), so
 * a tenant sending slowly, or many at once, leaves room for the others.
 */
const MAX_UPLOADS_AT_ONCE = 32;
const TENANT_SHARE = 4;
/** What a client refused for that is told to wait: a transcription takes seconds. */
const BUSY_RETRY_AFTER_SECONDS = 5;

export type VoiceDeps = { log: Logger };
export type VoiceSettings = {
  /** null: no provider; `unavailable` says why */
  transcriber: Transcriber | null;
  unavailable: string;
  maxSeconds: number;
  /** uploads taken at once (tests make it small) */
  maxUploads?: number;
};

export type Transcription = {
  text: string;
  language: string | null;
  duration_seconds: number | null;
  segments: { start: number; end: number; text: string }[];
  provider: string;
  model: string;
};

type TranscribeOptions = { signal: AbortSignal; log?: Logger; complete: (sha256: string | null) => Promise<UploadTerms>; digest?: boolean };
type Transcribed = { transcript: Transcription; sha256: string | null };

export function voiceOf(deps: VoiceDeps, settings: VoiceSettings) {
  const uploads = admission({
    max: settings.maxUploads ?? MAX_UPLOADS_AT_ONCE,
    tenantShare: TENANT_SHARE,
    what: 'uploads',
    retryAfterSeconds: BUSY_RETRY_AFTER_SECONDS,
  });

  function assertConfigured(): Transcriber {
    if (!settings.transcriber) throw new TranscriptionNotConfiguredError(settings.unavailable);
    return settings.transcriber;
  }

  /**
   * Transcribes the audio `stream` carries. What it is and how long it plays is judged from its first
   * bytes before the provider is asked; a provider that streams then takes it as it arrives. `complete` runs once
   * every byte is here, before the provider has the last of them (a form's later fields, the caller's own checks,
   * given the audio's sha256 with `digest`), and names the language and prompt. Nothing of the audio is kept
   * after the answer.
   */
  async function transcribe(tenantId: string, stream: Readable, opts: TranscribeOptions): Promise<Transcribed> {
    const transcriber = assertConfigured();
    return uploads.hold(tenantId, () => transcribeUpload(tenantId, transcriber, stream, opts));
  }

  async function transcribeUpload(tenantId: string, transcriber: Transcriber, stream: Readable, opts: TranscribeOptions): Promise<Transcribed> {
    const upload = await AudioUpload.open(stream, {
      maxBytes: MAX_AUDIO_BYTES,
      maxSeconds: settings.maxSeconds,
      live: transcriber.streams,
      digest: opts.digest,
      complete: opts.complete,
    });
    try {
      const started = performance.now();
      let out;
      try {
        out = await transcriber.transcribe(upload, { signal: opts.signal, maxSeconds: settings.maxSeconds, tenantId });
      } catch (err) {
        // a provider's transfer that broke because the upload was refused answers why the upload was
        throw upload.failure ?? err;
      }
      const terms = await upload.settled;
      const duration = out.duration_seconds ?? upload.seconds;
      // formats whose header does not say (MP3, WebM, MP4) are checked by what the provider measured
      if (duration !== null && duration > settings.maxSeconds)
        throw new AudioRejectedError('audio-too-long', `the audio plays ${Math.round(duration)} s, over the ${settings.maxSeconds} s limit`, {
          duration_seconds: duration,
          max_seconds: settings.maxSeconds,
        });
      (opts.log ?? deps.log).info(
        {
          tenant_id: tenantId,
          bytes: upload.size,
          format: upload.format,
          duration_seconds: duration,
          provider: transcriber.name,
          model: transcriber.model,
          latency_ms: Math.round(performance.now() - started),
        },
        'audio transcribed',
      );
      const transcript: Transcription = {
        text: out.text,
        language: out.language ?? terms.language ?? null,
        duration_seconds: duration,
        segments: out.segments,
        provider: transcriber.name,
        model: transcriber.model,
      };
      // `digest`: the caller must know the same recording again (an idempotent run)
      return { transcript, sha256: await upload.sha256() };
    } finally {
      await upload.discard();
    }
  }

  return { assertConfigured, transcribe, maxBytes: MAX_AUDIO_BYTES };
}

export type VoiceFace = ReturnType<typeof voiceOf>;
