// What the voice route takes for audio, from its bytes: MPEG frames checked field by field, WAV headers
// whose byte rate agrees with the rest, a WAV's length however its chunks lie and whatever its byte rate says.
import { expect } from 'chai';
import { sniffAudio, WavLength } from '../../engine/voice/index.js';
import { chunk, IMA_SAMPLES_PER_BLOCK, imaAdpcm, padded, riff, wav as wavOf } from '../support/audio.js';

/** `n` MPEG-1 layer III frames, 128 kbit/s at 44.1 kHz (417 bytes each, no padding). */
const mp3Frames = (n: number) => Buffer.concat(Array.from({ length: n }, () => Buffer.concat([Buffer.from([0xff, 0xfb, 0x90, 0x00]), Buffer.alloc(413)])));

/** A WAV's seconds, its bytes pushed `piece` at a time: `[while arriving, once whole]`. */
function measure(wav: Buffer, piece = wav.length): [number | null, number | null] {
  const length = new WavLength();
  for (let at = 0; at < wav.length; at += piece) length.push(wav.subarray(at, at + piece));
  return [length.seconds(), length.seconds(wav.length)];
}

describe('audio sniffing', () => {
  it('takes MPEG layer III frames for MP3, and two bytes of frame sync alone for nothing', () => {
    expect(sniffAudio(mp3Frames(3))).to.equal('mp3');
    expect(sniffAudio(Buffer.from('ID3\x04\x00', 'latin1'))).to.equal('mp3');
    // UTF-16 text (FF FE), a reserved layer, a bad bitrate, a first frame not followed by another
    expect(sniffAudio(Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from('name,amount\n', 'utf16le')]))).to.equal(null);
    expect(sniffAudio(Buffer.from([0xff, 0xf9, 0x90, 0x00, 0, 0]))).to.equal(null);
    expect(sniffAudio(Buffer.from([0xff, 0xfb, 0xf0, 0x00, 0, 0]))).to.equal(null);
    const lone = mp3Frames(2);
    lone.fill(0x41, 417, 421);
    expect(sniffAudio(lone)).to.equal(null);
  });

  it('takes MP4 audio and WebM, not a HEIF or AVIF picture, a QuickTime movie or a Matroska file that start the same', () => {
    const ftyp = (major: string, ...compatible: string[]) => {
      const box = Buffer.alloc(16 + 4 * compatible.length);
      box.writeUInt32BE(box.length, 0);
      box.write(`ftyp${major}`, 4, 'latin1');
      compatible.forEach((c, i) => box.write(c, 16 + 4 * i, 'latin1'));
      return Buffer.concat([box, Buffer.alloc(64)]);
    };
    expect(sniffAudio(ftyp('M4A ', 'M4A ', 'mp42', 'isom'))).to.equal('mp4');
    expect(sniffAudio(ftyp('isom', 'isom', 'iso2', 'mp41'))).to.equal('mp4');
    expect(sniffAudio(ftyp('heic', 'mif1', 'heic'))).to.equal(null);
    expect(sniffAudio(ftyp('avif', 'avif', 'mif1', 'miaf'))).to.equal(null);
    expect(sniffAudio(ftyp('mp42', 'mif1', 'miaf'))).to.equal(null);
    expect(sniffAudio(ftyp('qt  ', 'qt  '))).to.equal(null);
    // an EBML header: version fields, then DocType (0x4282) and its version
    const ebml = (docType: string) => {
      const fields = Buffer.concat([
        Buffer.from([0x42, 0x86, 0x81, 1, 0x42, 0xf7, 0x81, 1, 0x42, 0xf2, 0x81, 4, 0x42, 0xf3, 0x81, 8]),
        Buffer.from([0x42, 0x82, 0x80 | docType.length]),
        Buffer.from(docType, 'latin1'),
        Buffer.from([0x42, 0x87, 0x81, 4, 0x42, 0x85, 0x81, 2]),
      ]);
      return Buffer.concat([Buffer.from([0x1a, 0x45, 0xdf, 0xa3, 0x80 | fields.length]), fields, Buffer.alloc(64)]);
    };
    expect(sniffAudio(ebml('webm'))).to.equal('webm');
    expect(sniffAudio(ebml('matroska'))).to.equal(null);
  });

  it('refuses a WAV whose byte rate disagrees with its sample rate and block size', () => {
    const wav = wavOf(1);
    expect(measure(wav)).to.deep.equal([1, 1]);
    wav.writeUInt32LE(0x7fffffff, 28);
    expect(() => measure(wav)).to.throw(/byte rate/);
    wav.writeUInt32LE(32_000, 28);
    wav.writeUInt32LE(0, 24);
    expect(() => measure(wav)).to.throw(/zero/);
  });

  it("follows a WAV's chunks past metadata of any size, in pieces of any size, and counts every data chunk", () => {
    // 100 KB of JUNK before the data: past the 64 KB the format is judged by
    const junk = padded(wavOf(120, 1000), 100_000);
    for (const piece of [junk.length, 64 * 1024, 1000, 7, 1]) expect(measure(junk, piece), `pushed ${piece} bytes at a time`).to.deep.equal([120, 120]);
    const length = new WavLength();
    length.push(junk.subarray(0, 100_000));
    expect(length.seconds(), 'the data header has not arrived').to.equal(null);
    // decoders play a second data chunk too
    const half = wavOf(30, 1000);
    const twice = riff(half.subarray(12, 36), chunk('LIST', Buffer.alloc(3)), half.subarray(36), chunk('data', Buffer.alloc(62_000)));
    expect(measure(twice, 4096)).to.deep.equal([61, 61]);
    // a recorder that streamed its WAV leaves the size unknown: what has arrived plays at least, the whole file exactly
    const streamed = wavOf(2, 1000);
    streamed.writeUInt32LE(0xffffffff, 40);
    const arriving = new WavLength();
    arriving.push(streamed.subarray(0, 44 + 2000));
    expect(arriving.seconds()).to.equal(1);
    expect(measure(streamed)).to.deep.equal([2, 2]);
    // written to a pipe by espeak-ng or sox: a placeholder near 2 GB, or any size more than the upload may hold
    streamed.writeUInt32LE(0x7ffff000, 40);
    expect(measure(streamed)).to.deep.equal([2, 2]);
    streamed.writeUInt32LE(50_000, 40);
    const bounded = new WavLength(40_000);
    bounded.push(streamed);
    expect(bounded.seconds(streamed.length)).to.equal(2);
    expect(() => measure(streamed), 'a size that fits in what may arrive is taken at its word').to.throw(/truncated/);
    expect(() => measure(wavOf(1).subarray(0, 1000))).to.throw(/truncated: its header promises 32000 bytes of audio, 956 arrived/);
    expect(() => measure(junk.subarray(0, 100_000))).to.throw(/no data chunk/);
  });

  it('measures IMA ADPCM by its blocks, not by the byte rate its header claims', () => {
    const seconds = (Math.ceil((120 * 8000) / IMA_SAMPLES_PER_BLOCK) * IMA_SAMPLES_PER_BLOCK) / 8000;
    expect(measure(imaAdpcm(120))).to.deep.equal([seconds, seconds]);
    // 8 bytes a sample, sixteen times the honest byte rate, would make 120 s look like 7.6
    expect(measure(imaAdpcm(120, 8000, { byteRate: 64_000 }))).to.deep.equal([seconds, seconds]);
    expect(measure(imaAdpcm(120, 8000, { extensible: true }))).to.deep.equal([seconds, seconds]);
    // a codec whose blocks say nothing of its samples (GSM 6.10): only decoding tells, as for MP3
    const gsm = imaAdpcm(1);
    gsm.writeUInt16LE(0x31, 20);
    expect(measure(gsm)).to.deep.equal([null, null]);
    const bad = imaAdpcm(1);
    bad.writeUInt16LE(8, 34);
    expect(() => measure(bad)).to.throw(/IMA ADPCM/);
  });
});
