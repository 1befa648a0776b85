// The direction of imports (DESIGN.md): api, workers and cli may import engine; engine imports none
// of them; nothing imports in a cycle. Checked on the real sources with dependency-cruiser.
import { expect } from 'chai';
import { cruise, type ICruiseResult } from 'dependency-cruiser';

const RULES = {
  forbidden: [
    {
      name: 'engine-stays-below-the-edges',
      severity: 'error' as const,
      from: { path: '^engine/' },
      to: { path: '^(api|workers|cli)/' },
    },
    {
      name: 'no-cycles',
      severity: 'error' as const,
      from: {},
      to: { circular: true },
    },
    {
      name: 'nothing-imports-an-entry-point',
      severity: 'error' as const,
      from: { path: '^(engine|workers|cli)/' },
      to: { path: '^(main\\.ts|api/main\\.ts|workers/main\\.ts)$' },
    },
    {
      // a capability is a folder with a face: another folder imports its index.ts, never a file behind it
      name: 'capabilities-meet-through-faces',
      severity: 'error' as const,
      from: { path: '^engine/([^/]+)/' },
      to: { path: '^engine/[^/]+/', pathNot: ['^engine/$1/', '^engine/[^/]+/index\\.ts$'] },
    },
    {
      name: 'edges-use-faces',
      severity: 'error' as const,
      from: { path: '^(api|workers|cli)/|^main\\.ts$' },
      to: { path: '^engine/[^/]+/', pathNot: '^engine/[^/]+/index\\.ts$' },
    },
    {
      name: 'platform-imports-no-capability',
      severity: 'error' as const,
      from: { path: '^engine/platform/' },
      to: { path: '^engine/', pathNot: '^engine/platform/' },
    },
    {
      name: 'store-imports-only-platform',
      severity: 'error' as const,
      from: { path: '^engine/store/' },
      to: { path: '^engine/', pathNot: '^engine/(store|platform)/' },
    },
    {
      // capabilities are composed by engine/index.ts and started by process/; they never reach up to either
      name: 'capabilities-do-not-reach-up',
      severity: 'error' as const,
      from: { path: '^engine/[^/]+/', pathNot: '^engine/process/' },
      to: { path: '^engine/(index\\.ts|process/)' },
    },
  ],
};

describe('architecture', function () {
  this.timeout(60_000);
  let result: ICruiseResult;
  before(async () => {
    const out = await cruise(['main.ts', 'api', 'engine', 'workers', 'cli', 'config'], {
      validate: true,
      ruleSet: RULES as never,
      tsPreCompilationDeps: true,
      doNotFollow: { path: 'node_modules' },
      exclude: { path: '(^|/)node_modules/|^dist/' },
    });
    result = out.output as ICruiseResult;
  });

  it('reads the whole source tree', () => {
    const files = result.modules.map((m) => m.source);
    expect(files).to.include('engine/automations/automations.ts');
    expect(files).to.include('api/app.ts');
    expect(result.summary.totalCruised).to.be.greaterThan(20);
  });

  it('has engine/ import nothing from api/, workers/ or cli/, and no import cycle', () => {
    const violations = result.summary.violations.map(
      (v) => `${v.rule.name}: ${v.from} -> ${v.to}${v.cycle ? ` (${v.cycle.map((c) => c.name).join(' -> ')})` : ''}`,
    );
    expect(violations).to.deep.equal([]);
  });

  it('changes a run only in engine/runs/transitions.ts (nothing else inserts or updates a run)', async () => {
    const { execFileSync } = await import('node:child_process');
    let hits = '';
    try {
      hits = execFileSync('grep', ['-rlE', 'runs\\.(update|insert)\\(', 'main.ts', 'api', 'engine', 'workers', 'cli'], { encoding: 'utf8' });
    } catch {
      hits = '';
    }
    const writers = hits
      .trim()
      .split('\n')
      .filter((f) => f && !f.startsWith('engine/store/'));
    expect(writers).to.deep.equal(['engine/runs/transitions.ts']);
  });

  it('keeps process.env inside config/env.ts', async () => {
    const { execFileSync } = await import('node:child_process');
    let hits = '';
    try {
      hits = execFileSync('grep', ['-rlE', 'process\\.env', 'main.ts', 'api', 'engine', 'workers', 'cli', 'config'], { encoding: 'utf8' });
    } catch {
      hits = ''; // grep exits 1 when nothing matches
    }
    expect(hits.trim().split('\n').filter(Boolean)).to.deep.equal(['config/env.ts']);
  });
});
