// A command's output as text: characters that a pipe's chunks or a kept tail cut in two come out whole.
import os from 'node:os';
import { expect } from 'chai';
import { runProcess } from '../../engine/tools/process.js';
import { noSandbox } from '../../engine/tools/sandbox.js';
import { TailBuffer } from '../../engine/tools/tool.js';

describe('output decoding', () => {
  async function streamed(command: string, maxBytes = 1024) {
    const texts = { stdout: [] as string[], stderr: [] as string[] };
    const r = await runProcess(noSandbox(), ['/bin/sh', '-c', command], {
      workspace: os.tmpdir(),
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin' },
      network: false,
      maxBytes,
      onOutput: (stream, text) => texts[stream].push(text),
    });
    return { r, stdout: texts.stdout.join(''), stderr: texts.stderr.join(''), chunks: texts.stdout.length };
  }

  it('streams characters split between chunks of a pipe whole', async () => {
    // 2,000,000 € (3 bytes each) come in many chunks, most of them cut inside a character
    const { r, stdout, stderr, chunks } = await streamed('yes € | head -n 2000000 | tr -d "\\n"; printf "é%.0s" $(seq 5000) >&2');
    expect(r.exit_code).to.equal(0);
    expect(chunks).to.be.greaterThan(10);
    expect(stdout.includes('\ufffd')).to.equal(false);
    expect(stdout === '€'.repeat(2_000_000)).to.equal(true);
    expect(stderr).to.equal('é'.repeat(5000));
  });

  it('streams what the output ends with that is not a whole character', async () => {
    const { stdout } = await streamed("printf 'a€\\342\\202'");
    expect(stdout).to.equal('a€\ufffd');
  });

  it('keeps a tail that starts with a whole character', async () => {
    const { r } = await streamed('yes € | head -n 2000 | tr -d "\\n"', 1000);
    expect(r.truncated).to.equal(true);
    // 1000 bytes kept: the last 333 € and one byte of the one before, which is left out
    expect(r.stdout).to.equal('€'.repeat(333));
    const tail = new TailBuffer(8);
    for (const chunk of ['aé', '€€', '😀']) tail.push(Buffer.from(chunk));
    expect(tail.text()).to.equal('€😀');
    const whole = new TailBuffer(8);
    whole.push(Buffer.from([0x82, 0x61]));
    expect(whole.text(), 'nothing was dropped: the output is kept as it came').to.equal('\ufffda');
  });
});
