// What the voice route takes for audio, from its bytes: MPEG frames checked field by field, WAV headers
// whose byte rate agrees with the rest.
import { expect } from 'chai';
import { durationOf, sniffAudio } from '../../engine/voice/index.js';
import { wav as wavOf } from '../support/audio.js';

/** `n` MPEG-1 layer III frames, 128 kbit/s at 44.1 kHz (417 bytes each, no padding). */
const mp3Frames = (n: number) => Buffer.concat(Array.from({ length: n }, () => Buffer.concat([Buffer.from([0xff, 0xfb, 0x90, 0x00]), Buffer.alloc(413)])));

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

  it('refuses a WAV whose byte rate disagrees with its sample rate and block size', () => {
    const wav = wavOf(1);
    expect(durationOf('wav', wav, { size: wav.length, tail: wav.subarray(-64) })).to.equal(1);
    wav.writeUInt32LE(0x7fffffff, 28);
    expect(() => durationOf('wav', wav, { size: wav.length, tail: wav.subarray(-64) })).to.throw(/byte rate/);
    wav.writeUInt32LE(32_000, 28);
    wav.writeUInt32LE(0, 24);
    expect(() => durationOf('wav', wav, { size: wav.length, tail: wav.subarray(-64) })).to.throw(/zero/);
  });
});
