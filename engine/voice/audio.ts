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
  if (ascii(b, 0, 'ID3') || (b.length >= 2 && b[0] === 0xff && (b[1]! & 0xe0) === 0xe0)) return 'mp3';
  if (b.length >= 4 && b.readUInt32BE(0) === 0x1a45dfa3) return 'webm';
  if (ascii(b, 4, 'ftyp')) return 'mp4';
  return null;
}

const broken = (message: string) => new AudioRejectedError('audio-invalid', message);

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
      byteRate = b.readUInt32LE(at + 8 + 8);
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
