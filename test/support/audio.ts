// Audio the voice tests send: made here, byte by byte.

/** A RIFF chunk: its id, size and bytes, and the pad byte an odd size takes. */
export function chunk(id: string, body: Buffer): Buffer {
  const head = Buffer.alloc(8);
  head.write(id, 0, 'latin1');
  head.writeUInt32LE(body.length, 4);
  return Buffer.concat([head, body, Buffer.alloc(body.length % 2)]);
}

/** A WAV file holding these chunks. */
export function riff(...chunks: Buffer[]): Buffer {
  const body = Buffer.concat([Buffer.from('WAVE', 'latin1'), ...chunks]);
  const head = Buffer.alloc(8);
  head.write('RIFF', 0, 'latin1');
  head.writeUInt32LE(body.length, 4);
  return Buffer.concat([head, body]);
}

export type WavFormat = { format: number; channels: number; sampleRate: number; byteRate: number; blockAlign: number; bits: number; extra?: Buffer };

/** A fmt chunk; `extra` follows the 16 bytes every format has (an extension's size first). */
export function fmt(f: WavFormat): Buffer {
  const b = Buffer.alloc(16);
  b.writeUInt16LE(f.format, 0);
  b.writeUInt16LE(f.channels, 2);
  b.writeUInt32LE(f.sampleRate, 4);
  b.writeUInt32LE(f.byteRate, 8);
  b.writeUInt16LE(f.blockAlign, 12);
  b.writeUInt16LE(f.bits, 14);
  return chunk('fmt ', Buffer.concat([b, f.extra ?? Buffer.alloc(0)]));
}

/** A PCM WAV: a 44-byte header and `seconds` of silence (16 kHz, mono, 16 bit). */
export function wav(seconds: number, rate = 16_000): Buffer {
  const data = Math.round(seconds * rate) * 2;
  return riff(fmt({ format: 1, channels: 1, sampleRate: rate, byteRate: rate * 2, blockAlign: 2, bits: 16 }), chunk('data', Buffer.alloc(data)));
}

/** The WAV with a JUNK chunk of `bytes` before its data (recorders reserve room for metadata so). */
export function padded(wavFile: Buffer, bytes: number): Buffer {
  return riff(wavFile.subarray(12, 36), chunk('JUNK', Buffer.alloc(bytes)), wavFile.subarray(36));
}

/** IMA ADPCM's 4-bit samples in 256-byte mono blocks: 4 bytes of header (a sample of its own) and 504 more. */
export const IMA_SAMPLES_PER_BLOCK = 505;

/**
 * An IMA ADPCM WAV of `seconds` of silence, mono at `rate`; its header's byte rate is honest unless given
 * (a decoder ignores it). `extensible`: WAVE_FORMAT_EXTENSIBLE with the IMA ADPCM sub-format.
 */
export function imaAdpcm(seconds: number, rate = 8000, o: { byteRate?: number; extensible?: boolean } = {}): Buffer {
  const blocks = Math.ceil((seconds * rate) / IMA_SAMPLES_PER_BLOCK);
  const perBlock = Buffer.alloc(2);
  perBlock.writeUInt16LE(IMA_SAMPLES_PER_BLOCK);
  const guid = Buffer.from('11000000000010008000' + '00aa00389b71', 'hex');
  const extension = o.extensible ? Buffer.concat([Buffer.from([22, 0]), perBlock, Buffer.alloc(4), guid]) : Buffer.concat([Buffer.from([2, 0]), perBlock]);
  const byteRate = o.byteRate ?? Math.round((rate * 256) / IMA_SAMPLES_PER_BLOCK);
  const samples = Buffer.alloc(4);
  samples.writeUInt32LE(blocks * IMA_SAMPLES_PER_BLOCK);
  return riff(
    fmt({ format: o.extensible ? 0xfffe : 0x11, channels: 1, sampleRate: rate, byteRate, blockAlign: 256, bits: 4, extra: extension }),
    chunk('fact', samples),
    chunk('data', Buffer.alloc(blocks * 256)),
  );
}
