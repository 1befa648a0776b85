// engine/voice/index.ts: voice transcription: what an upload is (sniffed, measured), and the providers that turn it into text.
export { voiceOf, MAX_AUDIO_BYTES, type VoiceFace, type VoiceSettings, type Transcription } from './voice.js';
export { openAiTranscriber, type OpenAiTranscriberSettings } from './openai.js';
export { localTranscriber, findLocalPrograms, parseTimedOutput, LOCAL_MODEL, type LocalPrograms } from './local.js';
export { AudioUpload, type UploadTerms } from './upload.js';
export { sniffAudio, durationOf, WavLength, type AudioFormat } from './audio.js';
export type { Transcriber, TranscriberAudio, TranscriberOptions, TranscriberResult } from './transcriber.js';
