// An audio upload while it arrives. Its first bytes say what it is (sniffed, and its header's length
// checked) before any provider is asked; from then on a provider may take the bytes as they come, so
// the upload and the provider's transfer overlap. The newest chunk is always held back until the whole
// upload has arrived and passed its last checks (size, a truncated WAV, the length an Ogg's last page
// gives, and the caller's own): a provider never receives a complete upload that is then refused, and
// a refused one ends its transfer broken.
//
// Memory holds only what a provider that reads the upload as it arrives has not taken yet (nothing for one
// that reads a file). Every byte also goes to a private temporary file, which a retry and a provider that
// needs a file read; `discard()` removes it.
import { createHash, randomUUID, type Hash } from 'node:crypto';
import fs from 'node:fs';
import type { Readable } from 'node:stream';
import { finished } from 'node:stream/promises';
import { once } from 'node:events';
import { AudioRejectedError, PayloadTooLargeError, tempPrefix, ValidationError } from '../platform/index.js';
import { AUDIO_MIME, durationOf, sniffAudio, WavLength, type AudioFormat } from './audio.js';

/** What the caller learns only once the upload has arrived (a form's fields may follow its file). */
export type UploadTerms = { language?: string; prompt?: string };

export type UploadLimits = {
  maxBytes: number;
  maxSeconds: number;
  /** the provider takes the bytes as they arrive (`body()`): memory holds them until it has; otherwise only the file does */
  live: boolean;
  /** the upload's sha256 is taken as it arrives, for `complete` and `sha256()` (a caller that must know it again) */
  digest?: boolean;
  /**
   * the caller's checks once every byte is here and before a provider has the last of them (with the upload's
   * sha256 when `digest`, else null); what it answers is passed to the provider
   */
  complete: (sha256: string | null) => Promise<UploadTerms>;
};

/** Bytes read before the format is judged: a FLAC's STREAMINFO, an Ogg's first page; a WAV is read on to its data chunk's header. */
const HEAD_BYTES = 64 * 1024;
/** Fewer bytes than this hold no recording worth a provider's call (a header and a frame or two at most). */
const MIN_AUDIO_BYTES = 128;
/** Bytes kept from the end for the last checks: more than an Ogg page (at most 65,307 bytes). */
const TAIL_BYTES = 72 * 1024;

const tooLong = (seconds: number, max: number) =>
  new AudioRejectedError('audio-too-long', `the audio plays ${Math.round(seconds)} s, over the ${max} s limit`, {
    duration_seconds: seconds,
    max_seconds: max,
  });

export class AudioUpload {
  format!: AudioFormat;
  /** seconds, as the header says; null until known or when only decoding would tell */
  seconds: number | null = null;
  /** why the upload was refused or broke off */
  failure: Error | undefined;
  /** resolves once every byte has arrived and passed; rejects with `failure` */
  readonly settled: Promise<UploadTerms>;

  /** chunks the live reader has not taken; null once nobody reads live */
  private pending: Buffer[] | null;
  private liveTaken = false;
  /** the first bytes, then the last ones */
  private head: Buffer[] = [];
  private tail: Buffer[] = [];
  private tailBytes = 0;
  /** a WAV's chunks, followed past the head */
  private wav: WavLength | null = null;
  private bytes = 0;
  private ended = false;
  private passed = false;
  private readonly spillPath = `${tempPrefix('upload')}${randomUUID()}`;
  private readonly spill = fs.createWriteStream(this.spillPath, { flags: 'wx', mode: 0o600 });
  private readonly spilled: Promise<void>;
  /** the sha256 of what has arrived, with `digest`; its hex once every byte has */
  private readonly hash: Hash | null;
  private hex: string | null = null;
  private wake: () => void = () => {};
  private settle!: { resolve: (t: UploadTerms) => void; reject: (e: Error) => void };

  private constructor(
    private readonly stream: Readable,
    private readonly limits: UploadLimits,
  ) {
    this.pending = limits.live ? [] : null;
    this.hash = limits.digest ? createHash('sha256') : null;
    this.settled = new Promise<UploadTerms>((resolve, reject) => (this.settle = { resolve, reject }));
    this.spilled = finished(this.spill);
    // a caller that never asks still must not see an unhandled rejection
    this.settled.catch(() => undefined);
    this.spilled.catch((err: Error) => this.fail(err));
  }

  /** Reads the head of `stream` and judges it; the rest keeps arriving in the background. */
  static async open(stream: Readable, limits: UploadLimits): Promise<AudioUpload> {
    const upload = new AudioUpload(stream, limits);
    try {
      await upload.readHead();
    } catch (err) {
      await upload.discard();
      throw err;
    }
    return upload;
  }

  get size(): number {
    return this.bytes;
  }

  get mimeType(): string {
    return AUDIO_MIME[this.format];
  }

  /**
   * The bytes. The first reader takes them as they arrive, the newest held back until the upload has
   * passed; a later reader (a retry) reads them back once they have all arrived.
   */
  async *body(): AsyncGenerator<Buffer> {
    // one live reader only: a retry that starts while an abandoned transfer still waits for a chunk reads the file
    const queue = this.liveTaken ? null : this.pending;
    this.liveTaken = true;
    if (!queue) {
      this.pending = null;
      await this.stored();
      yield* fs.createReadStream(this.spillPath, { highWaterMark: HEAD_BYTES });
      return;
    }
    try {
      for (;;) {
        if (this.failure) throw this.failure;
        if (queue.length > (this.passed ? 0 : 1)) {
          yield queue.shift()!;
          continue;
        }
        if (this.passed) return;
        await new Promise<void>((resolve) => (this.wake = resolve));
      }
    } finally {
      this.pending = null;
    }
  }

  /** The whole upload once it has passed (a provider that needs a file). */
  async whole(): Promise<Buffer> {
    this.pending = null;
    await this.stored();
    return fs.promises.readFile(this.spillPath);
  }

  /** Copies the whole upload, once it has passed, to `file` (a provider that runs a program on it). */
  async saveAs(file: string): Promise<void> {
    this.pending = null;
    await this.stored();
    await fs.promises.copyFile(this.spillPath, file);
  }

  /** sha256 of the whole upload, hex, once it has passed; null unless opened with `digest`. */
  async sha256(): Promise<string | null> {
    await this.settled;
    return this.hex;
  }

  /** Removes the temporary file: once the request is answered. */
  async discard(): Promise<void> {
    this.pending = null;
    if (!this.spill.closed) {
      // a file still being opened is made after a remove that does not wait for it
      const closed = once(this.spill, 'close').catch(() => undefined);
      this.spill.destroy();
      await closed;
    }
    await fs.promises.rm(this.spillPath, { force: true });
  }

  /** The upload has passed and every byte is in the file. */
  private async stored(): Promise<void> {
    await this.settled;
    await this.spilled;
  }

  private readHead(): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      // a stream broken off before anyone listened (busboy does that to a part cut short) says so only here
      if (this.stream.errored || (this.stream.destroyed && !this.stream.readableEnded)) {
        const broke = new ValidationError('the upload broke off', [{ path: '/body', message: 'the audio ended before its part did' }]);
        this.fail(broke);
        reject(broke);
        return;
      }
      let judged = false;
      // the provider is asked once the head has passed, and a WAV's data header (its length) has arrived
      const judge = () => {
        if (judged) return;
        if (!this.format) this.judgeHead();
        if (this.wav && !this.wav.found && !this.ended) return;
        judged = true;
        resolve();
      };
      const refuse = (err: Error) => {
        this.fail(err);
        if (!judged) {
          judged = true;
          reject(err);
        }
      };
      this.stream.on('data', (chunk: Buffer) => {
        if (this.failure) return;
        this.bytes += chunk.length;
        if (this.bytes > this.limits.maxBytes) {
          refuse(new PayloadTooLargeError(`the audio is over the ${Math.round(this.limits.maxBytes / 1024 / 1024)} MB limit`));
          return;
        }
        this.spill.write(chunk);
        this.hash?.update(chunk);
        this.pending?.push(chunk);
        this.keepTail(chunk);
        try {
          if (!this.format) this.head.push(chunk);
          else if (this.wav) {
            this.wav.push(chunk);
            this.measured(this.wav.seconds());
          }
          if (this.bytes >= HEAD_BYTES) judge();
        } catch (err) {
          refuse(err as Error);
          return;
        }
        this.notify();
      });
      this.stream.once('end', () => {
        if (this.failure) return;
        this.ended = true;
        this.spill.end();
        try {
          judge();
        } catch (err) {
          refuse(err as Error);
          return;
        }
        void this.finish();
      });
      this.stream.once('error', (err: Error) => refuse(new ValidationError('the upload broke off', [{ path: '/body', message: err.message }])));
      // a client that went away may end the stream with no error at all
      this.stream.once('close', () => {
        if (!this.ended) refuse(new ValidationError('the upload broke off', [{ path: '/body', message: 'the connection closed before the audio ended' }]));
      });
    }).then(async () => {
      // an upload that ended inside its head has had its last checks before a provider is asked
      if (this.ended) await this.settled;
    });
  }

  private keepTail(chunk: Buffer): void {
    this.tail.push(chunk);
    this.tailBytes += chunk.length;
    while (this.tail.length > 1 && this.tailBytes - this.tail[0]!.length >= TAIL_BYTES) this.tailBytes -= this.tail.shift()!.length;
  }

  private judgeHead(): void {
    const head = Buffer.concat(this.head);
    this.head = [head];
    if (!head.length) throw new AudioRejectedError('audio-invalid', 'the audio is empty');
    const format = sniffAudio(head);
    if (!format) throw new AudioRejectedError('unsupported-audio', `the bytes are not audio this service reads (${Object.values(AUDIO_MIME).join(', ')})`);
    if (this.ended && head.length < MIN_AUDIO_BYTES) throw new AudioRejectedError('audio-invalid', `${head.length} bytes are too few to hold audio`);
    this.format = format;
    if (format === 'wav') {
      this.wav = new WavLength(this.limits.maxBytes);
      this.wav.push(head);
      this.measured(this.wav.seconds(this.ended ? this.bytes : undefined));
    } else this.measured(durationOf(format, head, this.ended ? { size: this.bytes, tail: head } : undefined));
  }

  /** Takes what the header says of the length, and refuses audio over the limit. */
  private measured(seconds: number | null): void {
    if (seconds !== null) this.seconds = seconds;
    if (this.seconds !== null && this.seconds > this.limits.maxSeconds) throw tooLong(this.seconds, this.limits.maxSeconds);
  }

  private async finish(): Promise<void> {
    try {
      this.measured(
        this.format === 'wav' ? this.wav!.seconds(this.bytes) : durationOf(this.format, this.head[0]!, { size: this.bytes, tail: Buffer.concat(this.tail) }),
      );
      this.hex = this.hash?.digest('hex') ?? null;
      const terms = await this.limits.complete(this.hex);
      this.passed = true;
      this.notify();
      this.settle.resolve(terms);
    } catch (err) {
      this.fail(err as Error);
    }
  }

  private fail(err: Error): void {
    if (this.failure) return;
    this.failure = err;
    this.pending = null;
    this.head = [];
    this.tail = [];
    this.settle.reject(err);
    this.notify();
  }

  private notify(): void {
    const wake = this.wake;
    this.wake = () => {};
    wake();
  }
}
