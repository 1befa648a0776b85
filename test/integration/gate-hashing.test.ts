// Hashing a gate's inputs reads each file through a stream, a few at a time: a workspace of large
// sparse files (which cost its tenant no disk) must not make the service hold them all in memory, and
// the digests stay what they were when each file was read whole (results already stored stay valid).
import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { FileHasher } from '../../engine/gates/index.js';

const MB = 1024 * 1024;

/** The digest as it was defined when files were read whole: sha256 over `path \0 hash \n` lines. */
function digestOf(lines: [string, string][]): string {
  return `sha256:${createHash('sha256')
    .update(lines.map(([f, h]) => `${f}\0${h}\n`).join(''))
    .digest('hex')}`;
}

const sha256 = (b: Buffer | string) => createHash('sha256').update(b).digest('hex');

/** A deterministic content of `n` bytes that is not all one byte. */
const pattern = (n: number) => Buffer.from(Array.from({ length: n }, (_, i) => (i * 31 + (i >> 11)) % 251));

describe('gate input hashing', function () {
  this.timeout(120_000);
  let dir: string;
  beforeEach(async () => {
    dir = await fs.realpath(await fs.mkdtemp(path.join(os.tmpdir(), 'gate-hashing-')));
  });
  afterEach(async () => {
    await fs.rm(dir, { recursive: true, force: true });
  });

  it('keeps the digests of ordinary files, links and missing files as they were', async () => {
    await fs.mkdir(path.join(dir, 'src'));
    const big = pattern(3 * MB + 17); // more than one chunk, not a whole number of them
    await fs.writeFile(path.join(dir, 'a.txt'), 'hello\n');
    await fs.writeFile(path.join(dir, 'empty'), '');
    await fs.writeFile(path.join(dir, 'src', 'big.bin'), big);
    await fs.symlink('a.txt', path.join(dir, 'ln'));
    const files = ['a.txt', 'empty', 'ln', 'missing.txt', 'src/big.bin'];
    const expected = digestOf([
      ['a.txt', sha256('hello\n')],
      ['empty', sha256('')],
      ['ln', 'link:a.txt'],
      ['missing.txt', 'missing'],
      ['src/big.bin', sha256(big)],
    ]);
    // the same as computed by the hasher that read files whole (pinned)
    expect(expected).to.equal('sha256:1ad3306652e7323ebb05f3221de091b3fc447de09cd23795c721ce309b84c30d');
    const hasher = new FileHasher();
    expect(await hasher.digest(dir, files)).to.equal(expected);
    // and again from what it kept, and from a hasher of its own
    expect(await hasher.digest(dir, files)).to.equal(expected);
    expect(await new FileHasher().digest(dir, files)).to.equal(expected);
    // a build's new names each time: what is gone, or named by none of the last 16 digests, is forgotten
    expect(hasher.size).to.equal(3);
    for (let round = 0; round < 20; round++) {
      const named = `gen/bundle-${round}.js`;
      await fs.mkdir(path.join(dir, 'gen'), { recursive: true });
      await fs.rm(path.join(dir, 'gen', `bundle-${round - 1}.js`), { force: true });
      await fs.writeFile(path.join(dir, named), `round ${round}\n`);
      await hasher.digest(dir, [`gen/bundle-${round - 1}.js`, named]);
    }
    expect(hasher.size, 'the files of the last round, not every round’s').to.be.at.most(2);
    for (let round = 0; round < 20; round++) await hasher.digest(dir, [`only-${round % 2}.txt`]);
    expect(hasher.size, 'named by none of the last 16 digests').to.equal(0);
    // what it kept still gives the same digest
    expect(await hasher.digest(dir, files)).to.equal(expected);
  });

  it('keeps the digest of a few thousand files, taken a slice at a time, as it was when they were taken all at once', async () => {
    const names = Array.from({ length: 2345 }, (_, i) => `f${String(i).padStart(5, '0')}.txt`);
    await Promise.all(names.map((n, i) => fs.writeFile(path.join(dir, n), `file ${i}\n`)));
    const files = [...names, 'gone.txt'];
    expect(await new FileHasher().digest(dir, files)).to.equal(
      digestOf([...names.map((n, i) => [n, sha256(`file ${i}\n`)] as [string, string]), ['gone.txt', 'missing']]),
    );
  });

  it('hashes 16 sparse 60 MB inputs without holding them in memory, and to the same digest as read whole', async () => {
    const files = Array.from({ length: 16 }, (_, i) => `sparse-${String(i).padStart(2, '0')}.bin`);
    for (const f of files) {
      await fs.writeFile(path.join(dir, f), '');
      await fs.truncate(path.join(dir, f), 60 * MB); // sparse: no disk
    }
    // the hash of 60 MB of zeros, computed a chunk at a time
    const zeros = createHash('sha256');
    const chunk = Buffer.alloc(MB);
    for (let i = 0; i < 60; i++) zeros.update(chunk);
    const zeroHash = zeros.digest('hex');

    const base = process.memoryUsage();
    const peak = { rss: base.rss, arrayBuffers: base.arrayBuffers };
    const sample = () => {
      const m = process.memoryUsage();
      peak.rss = Math.max(peak.rss, m.rss);
      peak.arrayBuffers = Math.max(peak.arrayBuffers, m.arrayBuffers);
    };
    const timer = setInterval(sample, 1);
    let digest: string;
    try {
      digest = await new FileHasher().digest(dir, files);
    } finally {
      clearInterval(timer);
      sample();
    }
    const grew = { rss: (peak.rss - base.rss) / MB, arrayBuffers: (peak.arrayBuffers - base.arrayBuffers) / MB };
    console.log(`      hashing 16 sparse 60 MB files: peak growth rss ${grew.rss.toFixed(0)} MB, array buffers ${grew.arrayBuffers.toFixed(0)} MB`);
    expect(digest).to.equal(digestOf(files.map((f) => [f, zeroHash])));
    expect(grew.arrayBuffers).to.be.below(100);
    expect(grew.rss).to.be.below(150);
  });
});
