// The local provider's places (engine/voice/local.ts) with stand-in programs: the time limit counts from a
// transcription's place, not from its place in line; tenants take the places in turn; a decoder that was
// killed is the service's failure (502), not the audio's (422), unless the sandbox's own limit ended it.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { expect } from 'chai';
import { openSandbox } from '../../engine/tools/index.js';
import { AudioUpload, localTranscriber, type LocalPrograms } from '../../engine/voice/index.js';
import { wav } from '../support/audio.js';
import { createLogger } from '../../engine/platform/index.js';

describe('the local provider’s places, with stand-in programs', function () {
  this.timeout(30_000);
  let dir: string;
  const sandbox = openSandbox({ mode: 'none', limits: {} as never, prefix: 'voice-turns', pathVar: process.env.PATH, log: createLogger('silent') });
  before(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'voice-turns-'));
  });
  after(() => fs.rmSync(dir, { recursive: true, force: true }));

  /** a decoder that takes `seconds`, then writes a second of silence (or kills itself), and a recogniser that hears one word */
  const programs = (seconds: number, decoderBody?: string): LocalPrograms => {
    const decoder = path.join(dir, `decode-${seconds}-${decoderBody ? 'x' : 'ok'}.sh`);
    fs.writeFileSync(decoder, `#!/bin/sh\nsleep ${seconds}\n${decoderBody ?? 'head -c 32000 /dev/zero > audio.raw'}\n`, { mode: 0o755 });
    const recognizer = path.join(dir, 'recognize.sh');
    fs.writeFileSync(recognizer, '#!/bin/sh\necho "<s> 0.00 0.10 1.0"\necho "hello 0.10 0.50 1.0"\necho "</s> 0.50 0.60 1.0"\n', { mode: 0o755 });
    return { decoder: { kind: 'sox', path: decoder }, recognizer };
  };
  const upload = () => AudioUpload.open(Readable.from([wav(1)]), { maxBytes: 1e7, maxSeconds: 60, live: false, complete: async () => ({}) });
  const transcribe = async (t: ReturnType<typeof localTranscriber>, tenantId: string) => {
    const u = await upload();
    try {
      return await t.transcribe(u, { signal: new AbortController().signal, maxSeconds: 60, tenantId });
    } finally {
      await u.discard();
    }
  };

  it('counts the time limit from a transcription’s place: one that waited for it still has all its time', async () => {
    // one place, 0.9 s each, a limit of 1.5 s: the second waits 0.9 s and then works 0.9 s, 1.8 s from its request
    const t = localTranscriber({ programs: programs(0.9), sandbox, env: { PATH: process.env.PATH! }, timeoutMs: 1500, concurrency: 1 });
    const answers = await Promise.all([transcribe(t, 'a'), transcribe(t, 'a')]);
    expect(answers.map((a) => a.text)).to.deep.equal(['hello', 'hello']);
    // a wait longer than the limit ends in line (0.9 s each: the third waits 1.8 s)
    const three = await Promise.allSettled([transcribe(t, 'a'), transcribe(t, 'a'), transcribe(t, 'a')]);
    expect(three.map((r) => r.status)).to.deep.equal(['fulfilled', 'fulfilled', 'rejected']);
    const refused = (three[2] as PromiseRejectedResult).reason as { code: string; message: string };
    expect(refused.code).to.equal('transcription-timeout');
    expect(refused.message).to.contain('no local recogniser was free');
  });

  it('gives the places to tenants in turn: one upload of another tenant goes before the rest of a tenant’s line', async () => {
    const t = localTranscriber({ programs: programs(0.3), sandbox, env: { PATH: process.env.PATH! }, timeoutMs: 10_000, concurrency: 1 });
    const order: string[] = [];
    const asked = (tenant: string, label: string) => transcribe(t, tenant).then(() => order.push(label));
    const first = ['a1', 'a2', 'a3'].map((l) => asked('a', l));
    await new Promise((r) => setTimeout(r, 50));
    await Promise.all([...first, asked('b', 'b1')]);
    expect(order).to.deep.equal(['a1', 'b1', 'a2', 'a3']);
  });

  it('keeps a tenant’s last turn while it is idle: one that sends an upload at a time takes its turn, not every other place', async () => {
    const t = localTranscriber({ programs: programs(0.2), sandbox, env: { PATH: process.env.PATH! }, timeoutMs: 20_000, concurrency: 1 });
    const order: string[] = [];
    const asked = (tenant: string, label: string) => transcribe(t, tenant).then(() => order.push(label));
    // a sends its next upload when the one before is answered; b and c have three each in line
    const one = (async () => {
      for (const l of ['a1', 'a2', 'a3']) await asked('a', l);
    })();
    await new Promise((r) => setTimeout(r, 50));
    await Promise.all([one, ...['b1', 'b2', 'b3'].map((l) => asked('b', l)), ...['c1', 'c2', 'c3'].map((l) => asked('c', l))]);
    expect(order).to.deep.equal(['a1', 'b1', 'c1', 'a2', 'b2', 'c2', 'a3', 'b3', 'c3']);
  });

  it('answers a decoder killed by a signal as the provider’s failure, not as audio it cannot decode', async () => {
    const t = localTranscriber({ programs: programs(0, 'kill -SEGV $$'), sandbox, env: { PATH: process.env.PATH! }, timeoutMs: 5000, concurrency: 1 });
    const err = (await transcribe(t, 'a').catch((e: unknown) => e)) as { code: string; message: string };
    expect(err.code).to.equal('transcription-provider-error');
    expect(err.message).to.contain('signal SIGSEGV');
    const refused = localTranscriber({ programs: programs(0, 'exit 1'), sandbox, env: { PATH: process.env.PATH! }, timeoutMs: 5000, concurrency: 1 });
    expect(await transcribe(refused, 'a').catch((e: { code: string }) => e.code)).to.equal('audio-invalid');
  });

  it('answers a decoder the sandbox’s CPU limit ended as audio it cannot decode (422): the upload made it spin', async () => {
    // the sandbox of no isolation, but with limits (as bwrap's has), and a decoder that spins past its own 1 s of CPU
    const limited = { ...sandbox, limits: { cpuSeconds: 1, memoryMb: 512, processes: 64, fileSizeMb: 64 } };
    const spin = programs(0, 'ulimit -S -t 1\nwhile :; do :; done');
    const t = localTranscriber({ programs: spin, sandbox: limited, env: { PATH: process.env.PATH! }, timeoutMs: 10_000, concurrency: 1 });
    const err = (await transcribe(t, 'a').catch((e: unknown) => e)) as { code: string; message: string };
    expect(err.code, err.message).to.equal('audio-invalid');
    expect(err.message).to.contain("within the sandbox's CPU time limit");
    // the same signal where the sandbox sets no limit is a crash: the service's failure
    const unlimited = localTranscriber({ programs: spin, sandbox, env: { PATH: process.env.PATH! }, timeoutMs: 10_000, concurrency: 1 });
    const crash = (await transcribe(unlimited, 'a').catch((e: unknown) => e)) as { code: string; message: string };
    expect(crash.code).to.equal('transcription-provider-error');
    expect(crash.message).to.contain('signal SIGXCPU');
  });
});
