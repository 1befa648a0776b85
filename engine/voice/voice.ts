// Transcribes one upload: checks what it is before any provider sees it, and keeps nothing. One log line
// per transcription, with sizes and timings, never the text.
import { performance } from 'node:perf_hooks';
import { AudioRejectedError, TranscriptionNotConfiguredError, type Logger } from '../platform/index.js';
import { AUDIO_MIME, durationOf, sniffAudio } from './audio.js';
import type { Transcriber } from './transcriber.js';

/** The largest upload taken (the OpenAI API's own limit). */
export const MAX_AUDIO_BYTES = 25 * 1024 * 1024;

export type VoiceDeps = { log: Logger };
export type VoiceSettings = {
  /** null: no provider; `unavailable` says why */
  transcriber: Transcriber | null;
  unavailable: string;
  maxSeconds: number;
};

export type Transcription = {
  text: string;
  language: string | null;
  duration_seconds: number | null;
  segments: { start: number; end: number; text: string }[];
  provider: string;
  model: string;
};

export function voiceOf(deps: VoiceDeps, settings: VoiceSettings) {
  function assertConfigured(): Transcriber {
    if (!settings.transcriber) throw new TranscriptionNotConfiguredError(settings.unavailable);
    return settings.transcriber;
  }

  function assertShortEnough(seconds: number | null): void {
    if (seconds !== null && seconds > settings.maxSeconds)
      throw new AudioRejectedError('audio-too-long', `the audio plays ${Math.round(seconds)} s, over the ${settings.maxSeconds} s limit`, {
        duration_seconds: seconds,
        max_seconds: settings.maxSeconds,
      });
  }

  async function transcribe(
    tenantId: string,
    upload: { bytes: Buffer; filename?: string },
    opts: { language?: string; prompt?: string; signal: AbortSignal; log?: Logger },
  ): Promise<Transcription> {
    const transcriber = assertConfigured();
    const { bytes } = upload;
    if (!bytes.length) throw new AudioRejectedError('audio-invalid', 'the audio is empty');
    const format = sniffAudio(bytes);
    if (!format) throw new AudioRejectedError('unsupported-audio', `the bytes are not audio this service reads (${Object.values(AUDIO_MIME).join(', ')})`);
    const headerSeconds = durationOf(format, bytes);
    assertShortEnough(headerSeconds);
    const started = performance.now();
    const out = await transcriber.transcribe(
      { bytes, format, filename: `audio.${format === 'mp3' ? 'mp3' : format === 'mp4' ? 'm4a' : format}` },
      { language: opts.language, prompt: opts.prompt, signal: opts.signal, maxSeconds: settings.maxSeconds },
    );
    const duration = out.duration_seconds ?? headerSeconds;
    // formats whose header does not say (MP3, WebM, MP4) are checked by what the provider measured
    assertShortEnough(duration);
    (opts.log ?? deps.log).info(
      {
        tenant_id: tenantId,
        bytes: bytes.length,
        format,
        duration_seconds: duration,
        provider: transcriber.name,
        model: transcriber.model,
        latency_ms: Math.round(performance.now() - started),
      },
      'audio transcribed',
    );
    return {
      text: out.text,
      language: out.language ?? opts.language ?? null,
      duration_seconds: duration,
      segments: out.segments,
      provider: transcriber.name,
      model: transcriber.model,
    };
  }

  return { assertConfigured, transcribe, maxBytes: MAX_AUDIO_BYTES };
}

export type VoiceFace = ReturnType<typeof voiceOf>;
