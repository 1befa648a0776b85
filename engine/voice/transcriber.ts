// The port every transcription provider fills.
import type { AudioFormat } from './audio.js';

export type TranscriberAudio = { bytes: Buffer; format: AudioFormat; filename: string };
export type TranscriberOptions = {
  language?: string;
  prompt?: string;
  signal: AbortSignal;
  /** the longest audio taken: a provider that decodes may stop there */
  maxSeconds: number;
};
export type TranscriptSegment = { start: number; end: number; text: string };
export type TranscriberResult = { text: string; language: string | null; duration_seconds: number | null; segments: TranscriptSegment[] };

export type Transcriber = {
  name: string;
  model: string;
  transcribe(audio: TranscriberAudio, opts: TranscriberOptions): Promise<TranscriberResult>;
};
