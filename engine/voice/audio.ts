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
  if (b.length >= 4 && b.readUInt32BE(0) === 0x1a45dfa3) return ebmlDocType(b) === 'matroska' ? null : 'webm';
  if (ascii(b, 4, 'ftyp')) return stillOrQuickTime(b) ? null : 'mp4';
  return null;
}

/**
 * Brands of an ISO media file that is a picture (HEIF, HEIC, AVIF) or a QuickTime movie, which no provider
 * takes for audio: sent on, they were a provider's 400 and the client's 502, and a call paid for.
 */
const NOT_AUDIO_BRANDS = new Set(['heic', 'heix', 'heim', 'heis', 'hevc', 'hevx', 'hevm', 'hevs', 'mif1', 'msf1', 'avif', 'avis', 'avio', 'qt  ']);

/** Whether an ftyp box (its size, `ftyp`, the major brand, a version, then compatible brands) names a picture or a movie. */
function stillOrQuickTime(b: Buffer): boolean {
  const end = Math.min(b.length, b.readUInt32BE(0) || b.length);
  if (NOT_AUDIO_BRANDS.has(b.toString('latin1', 8, 12))) return true;
  // a HEIF picture may name an audio-like major brand and carry mif1 or msf1 among the compatible ones
  for (let at = 16; at + 4 <= end; at += 4) if (['mif1', 'msf1'].includes(b.toString('latin1', at, at + 4))) return true;
  return false;
}

/** An EBML header's DocType (`webm`, `matroska`), or null when the first bytes do not say. */
function ebmlDocType(b: Buffer): string | null {
  // the header's elements follow its ID and size; DocType is element 0x4282, its size a one-byte vint (0x80 | n)
  for (let at = 5; at + 3 <= Math.min(b.length, 64); at++)
    if (b[at] === 0x42 && b[at + 1] === 0x82 && b[at + 2]! & 0x80) {
      const size = b[at + 2]! & 0x7f;
      return b.length >= at + 3 + size ? b.toString('latin1', at + 3, at + 3 + size) : null;
    }
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
 * Seconds of audio when the header says (FLAC, Ogg Opus/Vorbis); null when only decoding would tell. `head`
 * is the upload's first bytes. Without `whole` the upload is still arriving: an Ogg's length (its last page
 * tells) is not known yet. Throws on a broken FLAC. A WAV is measured by `WavLength` as it arrives.
 */
export function durationOf(format: Exclude<AudioFormat, 'wav'>, head: Buffer, whole?: WholeUpload): number | null {
  if (format === 'flac') return flacDuration(head);
  if (format === 'ogg') return whole ? oggDuration(head, whole.tail) : null;
  return null;
}

/** WAVE_FORMAT_EXTENSIBLE's sub-format GUIDs after their first four bytes, which hold the codec's format tag. */
const WAV_SUBFORMAT_TAIL = Buffer.from('000010008000' + '00aa00389b71', 'hex');
/** PCM, IEEE float, A-law, µ-law: one block a sample frame, so the byte rate is the sample rate times the block. */
const WAV_LINEAR = new Set([1, 3, 6, 7]);
const WAV_MS_ADPCM = 2;
const WAV_IMA_ADPCM = 0x11;

/**
 * How many seconds `n` bytes of a WAV's data play, from its fmt chunk's fields; null for a codec whose
 * length only decoding tells (as MP3's). Never from a compressed format's byte rate: decoders ignore it, so
 * a raised one (or a PCM byte rate of 0x7FFFFFFF) would make any length of audio look short.
 */
function wavPlaytime(f: Buffer): ((n: number) => number) | null {
  const format = f.readUInt16LE(0);
  const channels = f.readUInt16LE(2);
  const sampleRate = f.readUInt32LE(4);
  const byteRate = f.readUInt32LE(8);
  const blockAlign = f.readUInt16LE(12);
  const bits = f.readUInt16LE(14);
  if (!channels || !sampleRate || !byteRate || !blockAlign) throw broken('the WAV fmt chunk has a zero channel count, sample rate, byte rate or block size');
  // extensible: the codec is the sub-format's, when the GUID is one of the standard ones
  const codec = format !== 0xfffe ? format : f.length >= 40 && f.subarray(28, 40).equals(WAV_SUBFORMAT_TAIL) ? f.readUInt32LE(24) : null;
  if (codec !== null && WAV_LINEAR.has(codec)) {
    if (byteRate !== sampleRate * blockAlign || blockAlign !== (channels * bits) / 8)
      throw broken('the WAV fmt chunk’s byte rate does not agree with its sample rate, channels and sample size');
    return (n) => n / byteRate;
  }
  // ADPCM: each block decodes to as many samples as its size, the channels and the bits a sample say (as ffmpeg counts them)
  let perBlock = 0;
  if (codec === WAV_IMA_ADPCM) {
    if (bits < 2 || bits > 5 || blockAlign <= 4 * channels) throw broken('the WAV fmt chunk’s IMA ADPCM block size or sample size is not valid');
    perBlock = 1 + Math.floor(((blockAlign - 4 * channels) * 8) / (bits * channels));
  } else if (codec === WAV_MS_ADPCM) {
    if (blockAlign <= 7 * channels) throw broken('the WAV fmt chunk’s MS ADPCM block size is not valid');
    perBlock = 2 + Math.floor(((blockAlign - 7 * channels) * 2) / channels);
  }
  if (!perBlock) return null;
  return (n) => (Math.ceil(n / blockAlign) * perBlock) / sampleRate;
}

/** The fmt chunk's bytes read: the 16 every format has, and an extensible one's sub-format. */
const WAV_FMT_BYTES = 40;
/** Chunk ids as a little-endian number reads them: a file of empty chunks is millions of them. */
const FMT_ID = 0x20746d66;
const DATA_ID = 0x61746164;
/**
 * A data size a WAV written to a pipe declares for "the rest of the file" (espeak-ng --stdout, sox -t wav -):
 * from it up to 0xFFFFFFFF, as 0 (other recorders), the data is what arrives.
 */
const STREAMED_DATA_SIZE = 0x7ffff000;

/**
 * A WAV's length, followed as its bytes arrive: only each chunk's 8-byte header and the fmt chunk's fields are
 * kept, so metadata of any size before the data (a JUNK chunk of megabytes) is stepped over. Every data
 * chunk counts, as decoders play them all. Throws on a broken fmt chunk or data before it.
 */
export class WavLength {
  /** whether a data chunk's header has arrived */
  found = false;
  /** where the next chunk's header starts */
  private next = 12;
  private received = 0;
  /** the bytes from `next` on that have arrived, while fewer than a header (or the fmt fields) */
  private kept = Buffer.alloc(0);
  /** undefined until the fmt chunk is read */
  private playtime: ((n: number) => number) | null | undefined;
  /** bytes the data chunks of known size hold */
  private dataBytes = 0;
  /** the last data chunk of known size: where its bytes start, how many it promises */
  private last = { at: 0, size: 0 };
  /** where a data chunk of unknown size starts (a recorder that streamed its WAV): the rest of the file is audio */
  private restAt = -1;

  /** `maxBytes`: the most an upload may hold; a data chunk that declares more than can fit is of unknown size too. */
  constructor(private readonly maxBytes = Infinity) {}

  push(chunk: Buffer): void {
    const from = this.received;
    this.received += chunk.length;
    if (this.restAt >= 0) return;
    const b = this.kept.length ? Buffer.concat([this.kept, chunk]) : chunk.subarray(Math.max(0, this.next - from));
    let at = 0;
    while (b.length - at >= 8) {
      const id = b.readUInt32LE(at);
      const size = b.readUInt32LE(at + 4);
      if (id === FMT_ID && this.playtime === undefined) {
        if (size < 16) throw broken('the WAV fmt chunk is truncated');
        const fields = Math.min(size, WAV_FMT_BYTES);
        if (b.length - at < 8 + fields) break;
        this.playtime = wavPlaytime(b.subarray(at + 8, at + 8 + fields));
      } else if (id === DATA_ID) {
        if (this.playtime === undefined) throw broken('the WAV file has no usable fmt chunk before its data');
        this.found = true;
        if (size === 0 || size >= STREAMED_DATA_SIZE || this.next + 8 + size > this.maxBytes) {
          this.restAt = this.next + 8;
          return;
        }
        this.dataBytes += size;
        this.last = { at: this.next + 8, size };
      }
      const step = 8 + size + (size % 2);
      this.next += step;
      at += step;
    }
    // a copy: the few bytes kept must not hold on to the whole chunk
    this.kept = at < b.length ? Buffer.from(b.subarray(at)) : Buffer.alloc(0);
  }

  /**
   * Seconds the data plays. With `size` (the upload has all arrived, and every byte was pushed) exactly, and
   * throws on a truncated file; before, at least this many (the data declared so far). Null before the first
   * data chunk's header, or for a codec only decoding measures.
   */
  seconds(size?: number): number | null {
    let bytes = this.dataBytes;
    if (this.restAt >= 0) bytes += Math.max(0, (size ?? this.received) - this.restAt);
    if (size !== undefined) {
      if (!this.found) throw broken(this.playtime === undefined ? 'the WAV file is truncated: no fmt chunk' : 'the WAV file is truncated: no data chunk');
      const available = size - this.last.at;
      if (this.restAt < 0 && this.last.size > available)
        throw broken(`the WAV file is truncated: its header promises ${this.last.size} bytes of audio, ${available} arrived`);
      if (!bytes) throw broken('the WAV file holds no audio');
    }
    return this.found && this.playtime ? this.playtime(bytes) : null;
  }
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
