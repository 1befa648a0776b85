// Git's binary patches (`git diff --binary`): a vibe run's diff carries a file that is not UTF-8 text as one, so
// that the diff, kept and sent as text, holds its bytes whole, and a pull request made from it (or `git apply`)
// gets them back exactly. Written as git writes them: zlib-deflated bytes in git's base85, a line of at most 52
// bytes each, led by a letter that says how many; read back whether git sent the file whole or as a delta.
import { createHash } from 'node:crypto';
import { deflateSync, inflateSync } from 'node:zlib';

const EN85 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~';
const DE85 = new Map([...EN85].map((c, i) => [c, i]));
const LINE_BYTES = 52;
/** The most a file read back may hold (GitHub's own limit on a file): a patch that says more is refused before it is made. */
const MAX_FILE_BYTES = 100 * 1024 * 1024;

/** The name git gives a blob of these bytes, in a repository whose names are `hexLength` long (40: SHA-1, 64: SHA-256). */
export function gitBlobName(bytes: Buffer, hexLength = 40): string {
  return createHash(hexLength === 64 ? 'sha256' : 'sha1')
    .update(`blob ${bytes.length}\0`)
    .update(bytes)
    .digest('hex');
}

function encode85(data: Buffer): string {
  let out = '';
  for (let i = 0; i < data.length; i += 4) {
    // big-endian, the last group padded with zeros (the line's letter says how many bytes are real)
    let acc = ((data[i]! << 24) | ((data[i + 1] ?? 0) << 16) | ((data[i + 2] ?? 0) << 8) | (data[i + 3] ?? 0)) >>> 0;
    const group: string[] = [];
    for (let k = 0; k < 5; k++) {
      group.unshift(EN85[acc % 85]!);
      acc = Math.floor(acc / 85);
    }
    out += group.join('');
  }
  return out;
}

/** One `literal` block: the bytes deflated, in lines of base85, ended by an empty line. */
function literal(bytes: Buffer): string {
  const packed = deflateSync(bytes);
  let out = `literal ${bytes.length}\n`;
  for (let i = 0; i < packed.length; i += LINE_BYTES) {
    const line = packed.subarray(i, i + LINE_BYTES);
    out += (line.length <= 26 ? String.fromCharCode(64 + line.length) : String.fromCharCode(96 + line.length - 26)) + encode85(line) + '\n';
  }
  return out + '\n';
}

/** The body git gives a binary change after its header and `index` line: the new bytes whole, then the old (to reverse it). */
export function binaryPatch(oldBytes: Buffer, newBytes: Buffer): string {
  return `GIT binary patch\n${literal(newBytes)}${literal(oldBytes)}`;
}

/** A binary patch that cannot be read: the text was not git's. */
export class BinaryPatchError extends Error {}

function decode85Lines(lines: string[]): Buffer {
  const parts: Buffer[] = [];
  for (const line of lines) {
    const c = line.charCodeAt(0);
    const n = c >= 65 && c <= 90 ? c - 64 : c >= 97 && c <= 122 ? c - 96 + 26 : 0;
    const body = line.slice(1);
    if (!n || body.length !== Math.ceil(n / 4) * 5) throw new BinaryPatchError('a line of the binary patch is not base85 of its length');
    const out = Buffer.alloc(Math.ceil(n / 4) * 4);
    for (let g = 0; g < body.length / 5; g++) {
      let acc = 0;
      for (let k = 0; k < 5; k++) {
        const v = DE85.get(body[g * 5 + k]!);
        if (v === undefined) throw new BinaryPatchError('a line of the binary patch is not base85');
        acc = acc * 85 + v;
      }
      if (acc > 0xffffffff) throw new BinaryPatchError('a line of the binary patch is not base85');
      out.writeUInt32BE(acc, g * 4);
    }
    parts.push(out.subarray(0, n));
  }
  return Buffer.concat(parts);
}

/** A git delta applied to its source: copies from the source and bytes of its own, as git's patch-delta.c reads them. */
function applyDelta(source: Buffer, delta: Buffer): Buffer {
  let at = 0;
  const size = () => {
    let value = 0;
    let shift = 0;
    let byte: number;
    do {
      if (at >= delta.length) throw new BinaryPatchError('the delta ends early');
      byte = delta[at++]!;
      value += (byte & 0x7f) * 2 ** shift;
      shift += 7;
    } while (byte & 0x80);
    return value;
  };
  if (size() !== source.length) throw new BinaryPatchError('the delta is for another file');
  const target = size();
  if (target > MAX_FILE_BYTES) throw new BinaryPatchError('the delta makes a file over 100 MB');
  const out = Buffer.alloc(target);
  let written = 0;
  while (at < delta.length) {
    const cmd = delta[at++]!;
    if (cmd & 0x80) {
      let offset = 0;
      let length = 0;
      for (let k = 0; k < 4; k++) if (cmd & (1 << k)) offset += delta[at++]! * 2 ** (8 * k);
      for (let k = 0; k < 3; k++) if (cmd & (0x10 << k)) length += delta[at++]! * 2 ** (8 * k);
      if (length === 0) length = 0x10000;
      if (offset + length > source.length || written + length > out.length) throw new BinaryPatchError('the delta copies past its file');
      source.copy(out, written, offset, offset + length);
      written += length;
    } else if (cmd) {
      if (at + cmd > delta.length || written + cmd > out.length) throw new BinaryPatchError('the delta ends early');
      delta.copy(out, written, at, at + cmd);
      at += cmd;
      written += cmd;
    } else throw new BinaryPatchError('the delta holds an unknown instruction');
  }
  if (written !== out.length) throw new BinaryPatchError('the delta ends early');
  return out;
}

/**
 * The new bytes of a file from its section of a diff that holds `GIT binary patch`, given its old bytes (empty for a
 * file made); null when the section holds none. Only the forward block is read (the one after is the way back).
 */
export function applyBinaryPatch(section: string, oldBytes: Buffer): Buffer | null {
  const lines = section.split('\n');
  const start = lines.indexOf('GIT binary patch');
  if (start < 0) return null;
  const head = /^(literal|delta) (\d+)$/.exec(lines[start + 1] ?? '');
  if (!head) throw new BinaryPatchError('the binary patch names neither literal nor delta');
  const declared = Number(head[2]);
  if (declared > MAX_FILE_BYTES) throw new BinaryPatchError('the binary patch is over 100 MB');
  const end = lines.indexOf('', start + 2);
  let data: Buffer;
  try {
    // inflated no further than the size it says (a small patch may say a great deal)
    data = inflateSync(decode85Lines(lines.slice(start + 2, end < 0 ? undefined : end)), { maxOutputLength: Math.max(declared, 1) });
  } catch (err) {
    throw err instanceof BinaryPatchError ? err : new BinaryPatchError('the binary patch does not inflate');
  }
  if (data.length !== declared) throw new BinaryPatchError('the binary patch is not of the size it says');
  return head[1] === 'literal' ? data : applyDelta(oldBytes, data);
}
