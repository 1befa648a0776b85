// The port every transcription provider fills.
import type { AudioUpload } from './upload.js';

/** The upload as it arrives: `body()` streams it, `whole()` and `saveAs()` wait for all of it, `settled` names the language and prompt. */
export type TranscriberAudio = Pick<AudioUpload, 'format' | 'mimeType' | 'body' | 'whole' | 'saveAs' | 'settled' | 'failure'>;
export type TranscriberOptions = {
  signal: AbortSignal;
  /** the longest audio taken: a provider that decodes may stop there */
  maxSeconds: number;
  /** whose upload it is: a provider with few places (the local recogniser's cores) gives them to tenants in turn */
  tenantId?: string;
};
export type TranscriptSegment = { start: number; end: number; text: string };
export type TranscriberResult = { text: string; language: string | null; duration_seconds: number | null; segments: TranscriptSegment[] };

export type Transcriber = {
  name: string;
  model: string;
  /** takes the upload as it arrives (`body()`); otherwise it reads the whole upload once it has passed, and memory holds none of it meanwhile */
  streams: boolean;
  transcribe(audio: TranscriberAudio, opts: TranscriberOptions): Promise<TranscriberResult>;
};
