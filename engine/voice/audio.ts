// What an audio upload is, read from its first bytes (never from the Content-Type a client sent), and how
// long it plays when its header says so.
import { AudioRejectedError } from '../platform/index.js';

export type AudioFormat = 'wav' | 'ogg' | 'flac' | 'mp3' | 'webm' | 'mp4';

/** The MIME type a provider is told for each format. */
export const AUDIO_MIME: Record<AudioFormat, string> = {
  wav: 'audio/wav',
  ogg: 'audio/ogg',
  flac: 'audio/flac',
  mp3: 'audio/mpeg',
  webm: 'audio/webm',
  mp4: 'audio/mp4',
};

const ascii = (b: Buffer, at: number, text: string) => b.length >= at + text.length && b.toString('latin1', at, at + text.length) === text;

/** The format the bytes start like, or null for anything else. */
export function sniffAudio(b: Buffer): AudioFormat | null {
  if (ascii(b, 0, 'RIFF') && ascii(b, 8, 'WAVE')) return 'wav';
  if (ascii(b, 0, 'OggS')) return 'ogg';
  if (ascii(b, 0, 'fLaC')) return 'flac';
  if (ascii(b, 0, 'ID3') || mpegFrames(b)) return 'mp3';
  if (b.length >= 4 && b.readUInt32BE(0) === 0x1a45dfa3) return 'webm';
  if (ascii(b, 4, 'ftyp')) return 'mp4';
  return null;
}

const broken = (message: string) => new AudioRejectedError('audio-invalid', message);

// kbit/s by bitrate index, for MPEG-1 layer III and MPEG-2/2.5 layer III; Hz by sample-rate index, for MPEG-1
const MP3_KBPS_V1 = [0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320];
const MP3_KBPS_V2 = [0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160];
const MP3_HZ_V1 = [44100, 48000, 32000];

/** The length of the MPEG layer III frame whose header is at `at`, or 0 when it is no such header. */
function mp3FrameLength(b: Buffer, at: number): number {
  if (at + 4 > b.length || b[at] !== 0xff || (b[at + 1]! & 0xe0) !== 0xe0) return 0;
  const version = (b[at + 1]! >> 3) & 3; // 3 MPEG-1, 2 MPEG-2, 0 MPEG-2.5, 1 reserved
  const layer = (b[at + 1]! >> 1) & 3; // 1 layer III
  const bitrate = b[at + 2]! >> 4;
  const rate = (b[at + 2]! >> 2) & 3;
  if (version === 1 || layer !== 1 || bitrate === 0 || bitrate === 15 || rate === 3) return 0;
  const hz = MP3_HZ_V1[rate]! / (version === 3 ? 1 : version === 2 ? 2 : 4);
  const kbps = (version === 3 ? MP3_KBPS_V1 : MP3_KBPS_V2)[bitrate]!;
  const padding = (b[at + 2]! >> 1) & 1;
  return Math.floor(((version === 3 ? 144 : 72) * kbps * 1000) / hz) + padding;
}

/**
 * An MP3 with no ID3 tag: a layer III frame header whose fields are all valid, and another header where
 * the first frame ends (when the bytes reach it). Two bytes of frame sync alone would take a UTF-16 text
 * (FF FE) or any file starting FF Ex for audio.
 */
function mpegFrames(b: Buffer): boolean {
  const first = mp3FrameLength(b, 0);
  if (!first) return false;
  return first + 4 > b.length || mp3FrameLength(b, first) > 0;
}

/** An upload that has arrived whole: its size, and its last bytes (at least an Ogg page's worth). */
export type WholeUpload = { size: number; tail: Buffer };

/**
 * Seconds of audio when the header says (WAV, FLAC, Ogg Opus/Vorbis); null when only decoding would tell.
 * `head` is the upload's first bytes. Without `whole` the upload is still arriving: a WAV whose data is
 * not all here yet is not truncated, and an Ogg's length (its last page tells) is not known yet. Throws
 * on a broken WAV or FLAC.
 */
export function durationOf(format: AudioFormat, head: Buffer, whole?: WholeUpload): number | null {
  if (format === 'wav') return wavDuration(head, whole);
  if (format === 'flac') return flacDuration(head);
  if (format === 'ogg') return whole ? oggDuration(head, whole.tail) : null;
  return null;
}

/**
 * The bytes a second of a WAV's data holds, checked against the format's other fields: a header whose
 * byte rate is a lie (0x7FFFFFFF) would make any length of audio look short.
 */
function wavByteRate(b: Buffer, fmt: number): number {
  const format = b.readUInt16LE(fmt);
  const channels = b.readUInt16LE(fmt + 2);
  const sampleRate = b.readUInt32LE(fmt + 4);
  const byteRate = b.readUInt32LE(fmt + 8);
  const blockAlign = b.readUInt16LE(fmt + 12);
  const bits = b.readUInt16LE(fmt + 14);
  if (!channels || !sampleRate || !byteRate || !blockAlign) throw broken('the WAV fmt chunk has a zero channel count, sample rate, byte rate or block size');
  // PCM, float, extensible: the byte rate is the sample rate times the block; compressed: at most 8 bytes a sample a channel
  const linear = format === 1 || format === 3 || format === 0xfffe;
  if (linear ? byteRate !== sampleRate * blockAlign || blockAlign !== (channels * bits) / 8 : byteRate > sampleRate * channels * 8)
    throw broken('the WAV fmt chunk’s byte rate does not agree with its sample rate, channels and sample size');
  return byteRate;
}

function wavDuration(b: Buffer, whole: WholeUpload | undefined): number | null {
  const partial = !whole || b.length < whole.size;
  let byteRate = 0;
  for (let at = 12; at + 8 <= b.length;) {
    const id = b.toString('latin1', at, at + 4);
    const size = b.readUInt32LE(at + 4);
    if (id === 'fmt ') {
      if (size < 16 || at + 8 + 16 > b.length) {
        if (partial && size >= 16) return null;
        throw broken('the WAV fmt chunk is truncated');
      }
      byteRate = wavByteRate(b, at + 8);
    } else if (id === 'data') {
      if (!byteRate) throw broken('the WAV file has no usable fmt chunk before its data');
      // a recorder that streamed its WAV may leave the size unknown (0 or 0xFFFFFFFF): the rest of the file is the data
      const unknown = size === 0 || size === 0xffffffff;
      if (!whole) return unknown ? null : size / byteRate;
      const available = whole.size - at - 8;
      const dataSize = unknown ? available : size;
      if (dataSize > available) throw broken(`the WAV file is truncated: its header promises ${dataSize} bytes of audio, ${available} arrived`);
      if (dataSize === 0) throw broken('the WAV file holds no audio');
      return dataSize / byteRate;
    }
    at += 8 + size + (size % 2);
  }
  // the chunks before the data outran the head: only decoding would tell
  if (partial) return null;
  throw broken('the WAV file is truncated: no data chunk');
}

function flacDuration(b: Buffer): number | null {
  // fLaC, then the STREAMINFO block: a 4-byte header and 34 bytes
  if (b.length < 42 || (b[4]! & 0x7f) !== 0) throw broken('the FLAC file is truncated or has no STREAMINFO');
  const info = 8;
  const sampleRate = (b[info + 10]! << 12) | (b[info + 11]! << 4) | (b[info + 12]! >> 4);
  const totalSamples = (b[info + 13]! & 0x0f) * 2 ** 32 + b.readUInt32BE(info + 14);
  if (!sampleRate) throw broken('the FLAC STREAMINFO has no sample rate');
  return totalSamples ? totalSamples / sampleRate : null;
}

function oggDuration(head: Buffer, tail: Buffer): number | null {
  // the first page's packet names the codec; the last page's granule position counts samples
  if (head.length < 47) return null;
  let rate = 0;
  let skip = 0;
  if (ascii(head, 28, 'OpusHead')) {
    rate = 48_000;
    skip = head.readUInt16LE(28 + 10);
  } else if (ascii(head, 29, 'vorbis')) rate = head.readUInt32LE(28 + 12);
  if (!rate) return null;
  const last = tail.lastIndexOf('OggS', tail.length - 27, 'latin1');
  if (last < 0) return null;
  const granule = Number(tail.readBigInt64LE(last + 6));
  return granule > 0 ? Math.max(0, granule - skip) / rate : null;
}
