// The code host checkout as the sandbox sees it: the token reaches git only in a config file the service
// writes (and removes), never in a process's arguments or environment (bwrap would put the environment
// on its own command line, where any user of the host can read it).
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { createLogger } from '../../engine/platform/log.js';
import { TOOLS, openSandbox, type Sandbox, type ToolContext } from '../../engine/tools/index.js';
import { FAKE_TOKEN, makePullRequestRepo, startFakeProviders, type FakeProviders } from '../support/fake-providers.js';

describe('code host checkout', function () {
  this.timeout(30_000);
  let fake: FakeProviders;
  let root: string;
  let sandbox: Sandbox;
  before(async () => {
    fake = await startFakeProviders();
    root = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), 'checkout-')));
    sandbox = openSandbox({
      mode: 'auto',
      limits: { cpuSeconds: 60, memoryMb: 4096, processes: 256, fileSizeMb: 64 },
      prefix: 'checkout-test',
      pathVar: process.env.PATH,
      log: createLogger('silent'),
    });
  });
  after(async () => {
    sandbox.close();
    await fake.close();
    fs.rmSync(root, { recursive: true, force: true });
  });

  it('fetches into a fresh folder with the token in a private config file only, which is gone afterwards', async () => {
    const repo = makePullRequestRepo(root, 3, { path: 'src/x.ts', content: 'export const x = 3;\n' });
    fake.serveRepo('acme/x', repo.bare);
    const seen: { argv: string[]; env: Record<string, string> }[] = [];
    const spying: Sandbox = { ...sandbox, spawn: (argv, o) => (seen.push({ argv, env: { ...o.env } }), sandbox.spawn(argv, o)) };
    const dir = path.join(root, 'run-checkout');
    let used: string | null = null;
    const ctx = {
      workspace: root,
      signal: new AbortController().signal,
      output() {},
      async message() {},
      childEnv: { PATH: process.env.PATH ?? '/usr/bin:/bin' },
      httpAllowPrivate: true,
      sandbox: spying,
      network: false,
      networkAllowed: true,
      readOnlyBinds: [],
      checkouts: {
        async fresh() {
          fs.mkdirSync(dir, { recursive: true });
          return dir;
        },
        use(d: string) {
          used = d;
        },
      },
      connections: {
        act: async () => ({}),
        git: async () => ({ connection_id: 'con_x', web_url: fake.github, token: FAKE_TOKEN }),
      },
    } satisfies ToolContext;
    const result = await TOOLS.get('codehost')!.execute({ action: 'checkout', repository: 'acme/x', ref: 'refs/pull/3/head' }, ctx);
    expect(result.error, JSON.stringify(result.output)).to.equal(undefined);
    expect(result.output.head_sha).to.equal(repo.head);
    expect(used).to.equal(dir);
    expect(fs.readFileSync(path.join(dir, 'src/x.ts'), 'utf8')).to.equal('export const x = 3;\n');
    const basic = Buffer.from(`x-access-token:${FAKE_TOKEN}`).toString('base64');
    // the fetch, then the git folder put in place in the sandbox (the checkout bound by its descriptor), with no token
    expect(seen).to.have.length(2);
    expect(seen[1]!.argv.join(' ')).to.contain('rm -rf').and.contain('cp -R');
    expect(Object.keys(seen[1]!.env)).to.deep.equal(['PATH']);
    const everything = JSON.stringify(seen);
    expect(everything).not.to.contain(FAKE_TOKEN).and.not.to.contain(basic);
    // the file it was in is gone, and git read no system or user config but it
    const config = seen[0]!.env.GIT_CONFIG_GLOBAL!;
    expect(fs.existsSync(config)).to.equal(false);
    expect(seen[0]!.env.GIT_CONFIG_NOSYSTEM).to.equal('1');
    // and the code host got it, as a header
    expect(fake.requests.filter((r) => r.path.startsWith('/github/acme/x.git/')).every((r) => r.authorization === `Basic ${basic}`)).to.equal(true);
  });
});
