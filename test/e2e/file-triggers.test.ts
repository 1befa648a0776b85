// Triggers that fire by themselves, on a file's change: file_change through chokidar (schedules: triggers.test.ts).
import { spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { fileTriggersOf, validateTriggers } from '../../engine/automations/index.js';
import { MAX_GLOB_CHARS } from '../../engine/automations/globs.js';
import { automationFixture } from '../integration/store-contract.js';
import type { Automation, RunTrigger } from '../../engine/platform/index.js';
import { history, runsOnce } from '../support/automation-history.js';
import { eventually, freePort, KEYS, listening, startHarness, type Harness } from '../support/harness.js';

type Body = Record<string, any>;

/** A store of no runs, for the watchers made with a store of their own below (no automation's run is found running). */
const noRuns = { list: async () => ({ items: [], next_cursor: null }) };

/**
 * Waits until the process's file watcher has taken the automations of tenant A made so far and sees changes in
 * its root: a probe automation made now starts a run for a file written there (`watch-probe-*.tmp`, which no glob
 * of these tests matches). A fixed wait of 1.5 s for the watcher's refresh (every second) and its new watches was
 * too short on a busy machine: a change made before them is never seen.
 */
async function watching(h: Harness): Promise<void> {
  const probe = (
    await h.call<Body>('POST', '/api/v1/automations', {
      body: {
        name: 'watch probe',
        triggers: [{ type: 'file_change', paths: ['watch-probe-*.tmp'], debounce_ms: 0 }],
        steps: [{ tool: 'message', args: { text: 'probe' } }],
      },
    })
  ).body;
  try {
    let looks = 0;
    await eventually(async () => {
      // a new probe file every tenth look: one made before the watch began is never seen
      if (looks++ % 10 === 0) await fs.writeFile(path.join(h.tenantDir(), `watch-probe-${looks}.tmp`), 'x');
      return (await history(h, probe.id)).length > 0;
    }, 'the file watcher to take the automations');
  } finally {
    await h.call('DELETE', `/api/v1/automations/${probe.id}`);
  }
}

describe('file_change triggers', function () {
  this.timeout(30_000);
  let h: Harness;
  before(async () => {
    h = await startHarness({ env: { SERVICE_FILE_TRIGGER_REFRESH_SECONDS: '1' } });
  });
  after(async () => {
    await h.close();
  });

  it('starts one debounced run for a burst of matching changes, and none for others', async () => {
    const a = (
      await h.call('POST', '/api/v1/automations', {
        body: {
          name: 'on ts change',
          triggers: [{ type: 'file_change', paths: ['src/**/*.ts'], debounce_ms: 300 }],
          steps: [{ tool: 'shell', args: { command: 'true' } }],
        },
      })
    ).body;
    // the folders exist before the watcher starts, so the burst below is two file events, not a new
    // folder that the watcher must first discover (which can land outside the debounce window)
    await fs.mkdir(path.join(h.tenantDir(), 'src/lib'), { recursive: true });
    await watching(h);
    await fs.writeFile(path.join(h.tenantDir(), 'src/a.ts'), 'a');
    await fs.writeFile(path.join(h.tenantDir(), 'src/lib/b.ts'), 'b');
    await fs.writeFile(path.join(h.tenantDir(), 'README.md'), 'not watched');
    const runs = await runsOnce(h, a.id, 1, 'a file_change run');
    await new Promise((r) => setTimeout(r, 800));
    const all = await history(h, a.id);
    expect(all).to.have.length(1);
    expect(runs[0]!.trigger).to.deep.equal({ type: 'file_change', paths: ['src/a.ts', 'src/lib/b.ts'] });

    await fs.writeFile(path.join(h.tenantDir(), 'notes.txt'), 'x');
    await new Promise((r) => setTimeout(r, 800));
    expect(await history(h, a.id)).to.have.length(1);

    await h.call('POST', `/api/v1/automations/${a.id}/disable`);
    await new Promise((r) => setTimeout(r, 1500));
    await fs.writeFile(path.join(h.tenantDir(), 'src/c.ts'), 'c');
    await new Promise((r) => setTimeout(r, 1000));
    expect(await history(h, a.id)).to.have.length(1);
  });

  it('fires each change that follows the last batch closely, losing none (debounce 0)', async () => {
    const a = (
      await h.call('POST', '/api/v1/automations', {
        body: { name: 'no debounce', triggers: [{ type: 'file_change', paths: ['d0/**'], debounce_ms: 0 }], steps: [{ tool: 'message', args: { text: 'x' } }] },
      })
    ).body;
    await fs.mkdir(path.join(h.tenantDir(), 'd0'), { recursive: true });
    await watching(h);
    await fs.writeFile(path.join(h.tenantDir(), 'd0/first.txt'), '1');
    // once its run has ended (a change made while it runs is its own run's), well within the first batch's lock
    await eventually(async () => (await history(h, a.id)).some((r) => r.finished_at), 'the first run to end');
    await fs.writeFile(path.join(h.tenantDir(), 'd0/second.txt'), '2');
    const runs = await runsOnce(h, a.id, 2, 'a run for each change');
    expect(
      runs
        .map((r) => r.trigger.paths)
        .flat()
        .sort(),
    ).to.deep.equal(['d0/first.txt', 'd0/second.txt']);
  });

  it('does not start itself again with what its own run writes where its trigger looks, and fires for a change made after that run', async () => {
    const a = (
      await h.call('POST', '/api/v1/automations', {
        body: {
          name: 'writes where it looks',
          triggers: [{ type: 'file_change', paths: ['loop/**'], debounce_ms: 100 }],
          steps: [{ tool: 'shell', args: { command: 'sleep 0.3; date +%s%N >> loop/log.txt' } }],
        },
      })
    ).body;
    await fs.mkdir(path.join(h.tenantDir(), 'loop'), { recursive: true });
    await watching(h);
    await fs.writeFile(path.join(h.tenantDir(), 'loop/seed.txt'), 'seed');
    await runsOnce(h, a.id, 1, 'the seed’s run');
    await eventually(async () => (await history(h, a.id)).every((r) => r.finished_at), 'its run to end');
    // its run's write to loop/log.txt is seen, and starts nothing (it started a run at every run, for good)
    await new Promise((r) => setTimeout(r, 1500));
    expect(await history(h, a.id), 'one run: the seed’s').to.have.length(1);
    expect((await fs.readFile(path.join(h.tenantDir(), 'loop/log.txt'), 'utf8')).trim().split('\n')).to.have.length(1);
    // a change of someone else's after the run fires
    await fs.writeFile(path.join(h.tenantDir(), 'loop/seed.txt'), 'again');
    const [later] = await runsOnce(h, a.id, 2, 'a run for the later change'); // newest first
    expect(later!.trigger.paths).to.deep.equal(['loop/seed.txt']);
    await h.call('POST', `/api/v1/automations/${a.id}/disable`);
  });

  it('excludes the paths of a ! glob: a change there or elsewhere starts no run, one the other glob matches does', async () => {
    const a = (
      await h.call<Body>('POST', '/api/v1/automations', {
        body: {
          name: 'all but generated',
          triggers: [{ type: 'file_change', paths: ['neg/**', '!neg/gen/**'], debounce_ms: 100 }],
          steps: [{ tool: 'message', args: { text: 'x' } }],
        },
      })
    ).body;
    await fs.mkdir(path.join(h.tenantDir(), 'neg/gen'), { recursive: true });
    await watching(h);
    await fs.writeFile(path.join(h.tenantDir(), 'neg/gen/out.ts'), 'excluded');
    await fs.writeFile(path.join(h.tenantDir(), 'neg-unrelated.md'), 'unrelated');
    await fs.writeFile(path.join(h.tenantDir(), 'neg/kept.ts'), 'included');
    const runs = await runsOnce(h, a.id, 1, 'a run for neg/kept.ts');
    await new Promise((r) => setTimeout(r, 500));
    expect(await history(h, a.id)).to.have.length(1);
    expect(runs[0]!.trigger.paths).to.deep.equal(['neg/kept.ts']);
  });

  it("follows a tenant's root that is itself a link (its folder on another disk)", async () => {
    const linked = await startHarness({ env: { SERVICE_FILE_TRIGGER_REFRESH_SECONDS: '1' } });
    const elsewhere = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-tenant-disk-'));
    try {
      await fs.symlink(elsewhere, path.join(linked.workspace, 'tenant-a'));
      const a = (
        await linked.call<Body>('POST', '/api/v1/automations', {
          body: { name: 'linked', triggers: [{ type: 'file_change', paths: ['*.txt'], debounce_ms: 100 }], steps: [{ tool: 'message', args: { text: 'x' } }] },
        })
      ).body;
      await watching(linked);
      await fs.writeFile(path.join(elsewhere, 'note.txt'), 'x');
      const runs = await runsOnce(linked, a.id, 1, 'a run');
      expect(runs[0]!.trigger.paths).to.deep.equal(['note.txt']);
    } finally {
      await linked.close();
      await fs.rm(elsewhere, { recursive: true, force: true });
    }
  });

  it('fires for a root whose own path names a folder triggers never look into (a workspace root below a node_modules)', async () => {
    const parent = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-under-'));
    const under = await startHarness({ env: { SERVICE_FILE_TRIGGER_REFRESH_SECONDS: '1', SERVICE_WORKSPACE_ROOT: path.join(parent, 'node_modules', 'ws') } });
    try {
      const a = (
        await under.call<Body>('POST', '/api/v1/automations', {
          body: { name: 'under', triggers: [{ type: 'file_change', paths: ['*.txt'], debounce_ms: 100 }], steps: [{ tool: 'message', args: { text: 'x' } }] },
        })
      ).body;
      await watching(under);
      await fs.writeFile(path.join(under.tenantDir(), 'note.txt'), 'x');
      const runs = await runsOnce(under, a.id, 1, 'a run');
      expect(runs[0]!.trigger.paths).to.deep.equal(['note.txt']);
    } finally {
      await under.close();
      await fs.rm(parent, { recursive: true, force: true });
    }
  });

  it('matches a glob of many wildcards against a long file name without holding the process, and refuses extended globs', async () => {
    // picomatch's regular expression for `*a*a…b` backtracks without end on a name of 200 a's
    const refused = await h.call<Body>('POST', '/api/v1/automations', {
      body: {
        name: 'extglob',
        triggers: [{ type: 'file_change', paths: ['ok/*.txt', `${'*([a-z]|a)'.repeat(10)}b`] }],
        steps: [{ tool: 'message', args: { text: 'x' } }],
      },
    });
    expect(refused.status).to.equal(400);
    expect(refused.body.errors.map((e: Body) => e.path)).to.deep.equal(['/body/triggers/0/paths/1']);
    const a = (
      await h.call<Body>('POST', '/api/v1/automations', {
        body: {
          name: 'many stars',
          triggers: [{ type: 'file_change', paths: [`${'*a'.repeat(40)}b`, 'stars/*.txt'], debounce_ms: 50 }],
          steps: [{ tool: 'message', args: { text: 'x' } }],
        },
      })
    ).body;
    await fs.mkdir(path.join(h.tenantDir(), 'stars'), { recursive: true });
    await watching(h);
    await fs.writeFile(path.join(h.tenantDir(), 'a'.repeat(200)), 'x');
    await fs.writeFile(path.join(h.tenantDir(), 'stars/seen.txt'), 'x');
    const runs = await runsOnce(h, a.id, 1, 'a run for stars/seen.txt');
    expect(runs[0]!.trigger.paths).to.deep.equal(['stars/seen.txt']);
  });

  it('watches a tenant root removed and made again (it watched nothing more, silently)', async () => {
    const watcher = await startHarness({ env: { SERVICE_FILE_TRIGGER_REFRESH_SECONDS: '1' } });
    try {
      const a = (
        await watcher.call<Body>('POST', '/api/v1/automations', {
          body: { name: 'again', triggers: [{ type: 'file_change', paths: ['*.txt'], debounce_ms: 50 }], steps: [{ tool: 'message', args: { text: 'x' } }] },
        })
      ).body;
      await watching(watcher);
      await fs.writeFile(path.join(watcher.tenantDir(), 'before.txt'), 'x');
      await runsOnce(watcher, a.id, 1, 'a run for before.txt');
      await fs.rm(watcher.tenantDir(), { recursive: true, force: true }); // a run's rm -rf, an operator's restore
      await new Promise((r) => setTimeout(r, 1000));
      await fs.mkdir(watcher.tenantDir(), { recursive: true });
      await watching(watcher);
      await fs.writeFile(path.join(watcher.tenantDir(), 'after.txt'), 'x');
      const runs = await eventually(async () => (await history(watcher, a.id)).find((r) => r.trigger.paths.includes('after.txt')), 'a run for after.txt');
      expect(runs.trigger.paths).to.deep.equal(['after.txt']);
    } finally {
      await watcher.close();
    }
  });

  it('fires a file made and removed again each time (its removals are not one state), and never for an automation whose trigger changed meanwhile', async () => {
    const a = (
      await h.call<Body>('POST', '/api/v1/automations', {
        body: {
          name: 'again and again',
          triggers: [{ type: 'file_change', paths: ['again/**'], debounce_ms: 100 }],
          steps: [{ tool: 'message', args: { text: 'x' } }],
        },
      })
    ).body;
    await fs.mkdir(path.join(h.tenantDir(), 'again'), { recursive: true });
    await watching(h);
    const file = path.join(h.tenantDir(), 'again/f.txt');
    for (const [n, change] of [() => fs.writeFile(file, 'x'), () => fs.rm(file), () => fs.writeFile(file, 'x'), () => fs.rm(file)].entries()) {
      await change();
      await runsOnce(h, a.id, n + 1, `run ${n + 1}`);
      // ended before the next change: a change made while the automation's own run runs is that run's, and fires
      // nothing (a slower machine made the next change while run 2 still ran: 1 failure in 6)
      await eventually(async () => ((await history(h, a.id))[0]?.finished_at ? true : null), `run ${n + 1} to end`);
    }
    // a batch pending when its trigger is taken away fires nothing
    const patched = (
      await h.call<Body>('POST', '/api/v1/automations', {
        body: {
          name: 'changed',
          triggers: [{ type: 'file_change', paths: ['changed/**'], debounce_ms: 1500 }],
          steps: [{ tool: 'message', args: { text: 'x' } }],
        },
      })
    ).body;
    await fs.mkdir(path.join(h.tenantDir(), 'changed'), { recursive: true });
    await watching(h);
    await fs.writeFile(path.join(h.tenantDir(), 'changed/one.txt'), 'x');
    await new Promise((r) => setTimeout(r, 300));
    expect((await h.call('PATCH', `/api/v1/automations/${patched.id}`, { body: { triggers: [{ type: 'manual' }] } })).status).to.equal(200);
    await new Promise((r) => setTimeout(r, 2500));
    expect(await history(h, patched.id)).to.deep.equal([]);
  });

  it('lets go of every watch of a root no automation watches any more, and watches no root past its share of watches', async () => {
    /** The inotify watches this process holds. */
    const watches = async () => {
      let n = 0;
      for (const fd of await fs.readdir('/proc/self/fd')) {
        const target = await fs.readlink(`/proc/self/fd/${fd}`).catch(() => '');
        if (target === 'anon_inode:inotify') n += ((await fs.readFile(`/proc/self/fdinfo/${fd}`, 'utf8').catch(() => '')).match(/^inotify wd:/gm) ?? []).length;
      }
      return n;
    };
    const roots = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-watch-'));
    const fired: RunTrigger[] = [];
    // (a debounce the burst below fits in on a loaded machine: at 50 ms, 300 writes at once came as two batches under CI's load)
    const automation = (tenant: string): Automation => automationFixture(tenant, { triggers: [{ type: 'file_change', paths: ['**'], debounce_ms: 1000 }] });
    let enabled: Automation[] = [];
    const triggers = fileTriggersOf(
      {
        ...h.rt,
        store: {
          automations: {
            listEnabledWithTrigger: async () => enabled,
            get: async (t: string, id: string) => enabled.find((a) => a.tenant_id === t && a.id === id) ?? null,
          },
          runs: noRuns,
        },
        tenantRootOf: (t: string) => path.join(roots, t),
        rootEntriesMax: 400,
        entriesTotal: 500,
        tooLargeRetryMs: 4000,
      } as never,
      { refreshMs: 3_600_000, fire: async (_a, t) => void fired.push(t) },
    );
    try {
      for (const [tenant, folders] of [
        ['small', 30],
        ['large', 401],
        ['second', 200],
      ] as const)
        for (let i = 0; i < folders; i++) await fs.mkdir(path.join(roots, tenant, `d${i}`), { recursive: true });
      const before = await watches();
      const small = automation('small');
      enabled = [small];
      await triggers.start();
      expect((await watches()) - before, 'the small root: its folders and itself').to.be.within(30, 32);
      // a burst of 300 files: one run, naming the first 100 in order
      await Promise.all(Array.from({ length: 300 }, (_, i) => fs.writeFile(path.join(roots, 'small', `f${String(i).padStart(3, '0')}.txt`), 'x')));
      await eventually(() => fired.length > 0 || null, 'the burst to fire');
      await new Promise((r) => setTimeout(r, 300));
      expect(fired.length).to.equal(1);
      expect(fired[0]).to.deep.equal({ type: 'file_change', paths: Array.from({ length: 100 }, (_, i) => `f${String(i).padStart(3, '0')}.txt`) });
      // a root past its share is not watched, and holds no watch; one after it is held to what is left of the total
      enabled = [small, automation('large'), automation('second')];
      const withSmall = await watches();
      expect(withSmall - before, 'the small root and its 300 files').to.be.within(330, 332);
      await triggers.refresh();
      await new Promise((r) => setTimeout(r, 1500));
      expect((await watches()) - withSmall, 'the large root (401 folders of 400), and the second (200 of the 169 the small one left)').to.equal(0);
      expect(h.logs.join('\n').match(/its file_change triggers do not fire/g)).to.have.length(2);
      // a root that grows past its share while watched lets go of its watches then
      await Promise.all(Array.from({ length: 100 }, (_, i) => fs.writeFile(path.join(roots, 'small', `g${i}.txt`), 'x')));
      await eventually(async () => ((await watches()) <= before ? true : null), 'the small root, grown past its share, to be let go');
      // no automation left: every watch goes, the files' and folders' included
      await fs.rm(path.join(roots, 'large'), { recursive: true });
      await fs.rm(path.join(roots, 'small', 'g0.txt'));
      enabled = [automation('second')];
      // a root let go is counted again a while later: the second now fits what is left
      await new Promise((r) => setTimeout(r, 4000));
      await triggers.refresh();
      await new Promise((r) => setTimeout(r, 1500));
      expect((await watches()) - before, 'the second root, 200 folders, now within the total').to.be.within(200, 202);
      enabled = [];
      await triggers.refresh();
      expect(await watches()).to.be.at.most(before);
    } finally {
      await triggers.close();
      await fs.rm(roots, { recursive: true, force: true });
    }
  });

  it('matches a file event against many automations’ globs a slice at a time: the process is never held long, and the event still fires', async () => {
    const root = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-slices-'));
    // each automation's globs at their bound (MAX_GLOB_CHARS), each as slow as a glob gets against a long name of a's
    const slow = Array.from({ length: Math.floor(MAX_GLOB_CHARS / 126) }, () => `**/*${'a'.repeat(120)}b`);
    expect(validateTriggers([{ type: 'file_change', paths: slow }])).to.deep.equal([]);
    expect(validateTriggers([{ type: 'file_change', paths: [...slow, 'x'.repeat(200)] }])[0]?.message).to.match(/over the 8192 an automation may match/);
    // one stored before the bound, past it: not matched at all, and said so once
    const costly = automationFixture('t1', { triggers: [{ type: 'file_change', paths: [...slow, ...slow, '*'], debounce_ms: 0 }] });
    const enabled = [
      costly,
      ...Array.from({ length: 300 }, () => automationFixture('t1', { triggers: [{ type: 'file_change', paths: slow, debounce_ms: 0 }] })),
      automationFixture('t1', { triggers: [{ type: 'file_change', paths: ['*'], debounce_ms: 0 }] }),
    ];
    const fired: RunTrigger[] = [];
    const triggers = fileTriggersOf(
      {
        ...h.rt,
        store: {
          automations: { listEnabledWithTrigger: async () => enabled, get: async (_t: string, id: string) => enabled.find((a) => a.id === id) ?? null },
          runs: noRuns,
        },
        tenantRootOf: () => root,
      } as never,
      { refreshMs: 3_600_000, fire: async (_a, t) => void fired.push(t) },
    );
    try {
      await triggers.start();
      const name = 'a'.repeat(250);
      const started = performance.now();
      // the longest the process went without running a timer of 1 ms
      let last = performance.now();
      let stall = 0;
      const sampler = setInterval(() => {
        stall = Math.max(stall, performance.now() - last);
        last = performance.now();
      }, 1);
      await fs.writeFile(path.join(root, name), 'x');
      await eventually(() => fired.length > 0 || null, 'the last automation to fire', 20_000).finally(() => clearInterval(sampler));
      await triggers.refresh();
      await new Promise((r) => setTimeout(r, 200));
      expect(fired, 'the last automation only').to.deep.equal([{ type: 'file_change', paths: [name] }]);
      expect(h.logs.filter((l) => l.includes(costly.id) && l.includes('cost more than any may'))).to.have.length(1);
      // matched all at once, the 300 held the process 1.4 s (4-7 ms each on these machines); a slice at a time, 25-30 ms
      expect(stall, `the longest stall, of ${Math.round(performance.now() - started)} ms to the fire`).to.be.below(400);
    } finally {
      await triggers.close();
      await fs.rm(root, { recursive: true, force: true });
    }
  });

  it('fires a removal once however many processes watch it, when the folder changes again before the slower one fires', async () => {
    const roots = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-removal-'));
    const a = automationFixture('t1', { triggers: [{ type: 'file_change', paths: ['x.txt'], debounce_ms: 100 }] });
    const fired: string[] = [];
    // two processes on one Redis; the second reads the automation half a second later as its batch fires
    const process = (name: string, lateMs: number) =>
      fileTriggersOf(
        {
          ...h.rt,
          store: {
            automations: {
              listEnabledWithTrigger: async () => [a],
              get: async () => (await new Promise((r) => setTimeout(r, lateMs)), a),
            },
            runs: noRuns,
          },
          tenantRootOf: (t: string) => path.join(roots, t),
        } as never,
        { refreshMs: 3_600_000, fire: async () => void fired.push(name) },
      );
    await fs.mkdir(path.join(roots, 't1'), { recursive: true });
    await fs.writeFile(path.join(roots, 't1', 'x.txt'), 'x');
    const [p1, p2] = [process('p1', 0), process('p2', 500)];
    try {
      await p1.start();
      await p2.start();
      await new Promise((r) => setTimeout(r, 300));
      await fs.rm(path.join(roots, 't1', 'x.txt'));
      await new Promise((r) => setTimeout(r, 300));
      await fs.writeFile(path.join(roots, 't1', 'build.log'), 'a file no trigger watches, in the same folder');
      await new Promise((r) => setTimeout(r, 1500));
      expect(fired).to.have.length(1);
    } finally {
      await p1.close();
      await p2.close();
      await fs.rm(roots, { recursive: true, force: true });
    }
  });

  it('keeps the process up when Redis refuses the lock of a batch (out of memory): a warning, and the next change fires', async () => {
    // a private redis-server, which this test fills up: the lock's SET, outside any try, was an unhandled
    // rejection, which ends a worker process on Node 20
    const port = await freePort();
    const server = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
    const rejections: unknown[] = [];
    const onRejection = (reason: unknown) => void rejections.push(reason);
    process.on('unhandledRejection', onRejection);
    const roots = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-oom-'));
    const a = automationFixture('t1', { triggers: [{ type: 'file_change', paths: ['w/*.txt'], debounce_ms: 0 }] });
    const fired: string[][] = [];
    let redis: Redis | undefined;
    let triggers: ReturnType<typeof fileTriggersOf> | undefined;
    try {
      await eventually(() => listening(port), 'the private redis-server to listen');
      redis = new Redis(`redis://127.0.0.1:${port}`, { maxRetriesPerRequest: 1 });
      await fs.mkdir(path.join(roots, 't1', 'w'), { recursive: true });
      triggers = fileTriggersOf(
        {
          ...h.rt,
          redis,
          store: { automations: { listEnabledWithTrigger: async () => [a], get: async () => a }, runs: noRuns },
          tenantRootOf: (t: string) => path.join(roots, t),
        } as never,
        { refreshMs: 3_600_000, fire: async (_a, t) => void fired.push(t.type === 'file_change' ? t.paths : []) },
      );
      await triggers.start();
      await fs.writeFile(path.join(roots, 't1', 'w', 'warm-up.txt'), 'x');
      await eventually(() => fired.length === 1 || null, 'the warm-up change to fire');
      await redis.config('SET', 'maxmemory', '1');
      await fs.writeFile(path.join(roots, 't1', 'w', 'during-oom.txt'), 'x');
      const warned = () => h.logs.some((l) => l.includes('file_change trigger did not start a run') && l.includes('OOM'));
      await eventually(() => rejections.length > 0 || warned() || null, 'the refused lock to be seen');
      await new Promise((r) => setTimeout(r, 200));
      expect(
        rejections.map((r) => String(r)),
        'unhandled rejections',
      ).to.deep.equal([]);
      expect(warned(), 'the refused lock in the log').to.equal(true);
      expect(fired).to.deep.equal([['w/warm-up.txt']]);
      await redis.config('SET', 'maxmemory', '0');
      await fs.writeFile(path.join(roots, 't1', 'w', 'after.txt'), 'x');
      await eventually(() => fired.length === 2 || null, 'a change once Redis takes writes again to fire');
      expect(fired[1]).to.deep.equal(['w/after.txt']);
    } finally {
      process.off('unhandledRejection', onRejection);
      await triggers?.close();
      redis?.disconnect();
      server.kill('SIGKILL');
      await fs.rm(roots, { recursive: true, force: true });
    }
  });

  it("reports nothing of a watched folder replaced by a link: another tenant's file names are not read through it", async () => {
    await fs.mkdir(path.join(h.tenantDir(), 'inbox'), { recursive: true });
    await fs.mkdir(path.join(h.tenantDir('tenant-b'), 'private'), { recursive: true });
    await fs.writeFile(path.join(h.tenantDir('tenant-b'), 'customer-list.csv'), 'b');
    await fs.writeFile(path.join(h.tenantDir('tenant-b'), 'private', 'acquisition.md'), 'b');
    const a = (
      await h.call('POST', '/api/v1/automations', {
        body: {
          name: 'inbox',
          triggers: [{ type: 'file_change', paths: ['inbox/**'], debounce_ms: 100 }],
          steps: [{ tool: 'message', args: { text: 'x' } }],
        },
      })
    ).body;
    await watching(h);
    // what a run of the tenant's can do: its watched folder removed and at once a link in its place, later the link
    // gone and a folder again (the watcher read the folder again through the link in some of these tries)
    const inbox = path.join(h.tenantDir(), 'inbox');
    for (let i = 0; i < 4; i++) {
      await fs.rmdir(inbox);
      await fs.symlink(h.tenantDir('tenant-b'), inbox);
      await new Promise((r) => setTimeout(r, 700));
      await fs.unlink(inbox);
      await fs.mkdir(inbox);
      await new Promise((r) => setTimeout(r, 700));
    }
    expect((await history(h, a.id)).map((r) => r.trigger)).to.deep.equal([]);
    // a real folder again: its files fire, and its removals are reported
    await new Promise((r) => setTimeout(r, 500));
    await fs.writeFile(path.join(h.tenantDir(), 'inbox', 'mine.txt'), 'a');
    const [run] = await runsOnce(h, a.id, 1, 'a run for the real folder');
    expect(run!.trigger).to.deep.equal({ type: 'file_change', paths: ['inbox/mine.txt'] });
    // (ended first: a change made while the automation's own run runs is that run's)
    await eventually(async () => ((await history(h, a.id))[0]?.finished_at ? true : null), 'the run to end');
    await fs.rm(path.join(h.tenantDir(), 'inbox', 'mine.txt'));
    const [removal] = await runsOnce(h, a.id, 2, 'a run for the removal');
    expect(removal!.trigger).to.deep.equal({ type: 'file_change', paths: ['inbox/mine.txt'] });
  });

  it('still reports the removals of a folder whose files were made and removed at once (a build’s scratch folder)', async () => {
    const a = (
      await h.call('POST', '/api/v1/automations', {
        body: { name: 'out', triggers: [{ type: 'file_change', paths: ['out/**'], debounce_ms: 50 }], steps: [{ tool: 'message', args: { text: 'x' } }] },
      })
    ).body;
    await watching(h);
    const out = path.join(h.tenantDir(), 'out');
    /** the automation's runs once none runs (a change made while its own run runs is that run's, and fires nothing) */
    const settled = () =>
      eventually(async () => {
        const runs = await history(h, a.id);
        return runs.every((r) => r.finished_at) ? runs : null;
      }, 'its runs to end');
    /** the runs whose trigger names `rel`, once there are `n` of them, all ended */
    const naming = (rel: string, n: number) =>
      eventually(async () => {
        const runs = (await settled()).filter((r) => r.trigger.paths.includes(rel));
        return runs.length >= n ? runs : null;
      }, `${n} run(s) naming ${rel}`);
    for (let cycle = 0; cycle < 4; cycle++) {
      // made and removed faster than the watcher reads it: its files' folder is gone when their events come
      await fs.mkdir(out, { recursive: true });
      for (let i = 0; i < 20; i++) await fs.writeFile(path.join(out, `f${i}`), 'x');
      await fs.rm(out, { recursive: true, force: true });
      await new Promise((r) => setTimeout(r, 300));
      await settled();
      // then a real file, kept and removed: both fire
      await fs.mkdir(path.join(out, 'sub'), { recursive: true });
      await new Promise((r) => setTimeout(r, 200));
      await settled();
      await fs.writeFile(path.join(out, 'sub', `k${cycle}`), 'x');
      await naming(`out/sub/k${cycle}`, 1);
      // whatever else the write fired (a change after its add, on a loaded machine a debounce apart) has run too: a
      // removal during the automation's own run would be that run's, and fire nothing
      await new Promise((r) => setTimeout(r, 300));
      await settled();
      await fs.rm(path.join(out, 'sub', `k${cycle}`));
      await naming(`out/sub/k${cycle}`, 2);
    }
  });

  it("never follows a link out of the tenant's root: another tenant's files are not seen through it", async () => {
    // one link there before the watch starts, one made while it runs; links are not watched at all (the
    // kernel's watch of a link's path watches the folder it points to)
    await fs.symlink(h.tenantDir('tenant-b'), path.join(h.tenantDir(), 'peek'));
    const a = (
      await h.call('POST', '/api/v1/automations', {
        body: {
          name: 'peek',
          triggers: [{ type: 'file_change', paths: ['peek/**', 'peek2/**'], debounce_ms: 100 }],
          steps: [{ tool: 'message', args: { text: 'x' } }],
        },
      })
    ).body;
    // tenant-b is watched too (it has an automation of its own), and tenant-a links to its folder
    await h.call('POST', '/api/v1/automations', {
      key: KEYS.b,
      body: { name: 'b watches', triggers: [{ type: 'file_change', paths: ['**'] }], steps: [{ tool: 'message', args: { text: 'x' } }] },
    });
    await new Promise((r) => setTimeout(r, 1500));
    await fs.symlink(h.tenantDir('tenant-b'), path.join(h.tenantDir(), 'peek2'));
    await new Promise((r) => setTimeout(r, 500));
    await fs.writeFile(path.join(h.tenantDir('tenant-b'), 'acquisition-target.txt'), 'secret plans');
    await new Promise((r) => setTimeout(r, 1500));
    expect(await history(h, a.id)).to.deep.equal([]);
  });
});
