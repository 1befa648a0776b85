// The README's GitHub Actions workflow and GitLab CI job: they are YAML that parses, and every
// automation-service command line in them names a command and options the tool has.
import fs from 'node:fs';
import path from 'node:path';
import { expect } from 'chai';
import type { Command } from 'commander';
import YAML from 'yaml';
import { buildProgram } from '../../cli/program.js';
import { PROJECT_ROOT } from '../../config/paths.js';

const README = fs.readFileSync(path.join(PROJECT_ROOT, 'README.md'), 'utf8');

/** The first ```yaml block after a heading. */
function yamlAfter(heading: string): unknown {
  const at = README.indexOf(`\n${heading}\n`);
  expect(at, heading).to.be.above(-1);
  const block = /```yaml\n([\s\S]*?)```/.exec(README.slice(at));
  return YAML.parse(block![1]!);
}

/** Every shell line of the job that runs the tool, continuation lines joined. */
function toolLines(scripts: string[]): string[][] {
  return scripts
    .flatMap((s) => s.replace(/\\\n\s*/g, ' ').split('\n'))
    .filter((l) => /^\s*automation-service /.test(l))
    .map((l) => [...l.trim().matchAll(/'[^']*'|"[^"]*"|\S+/g)].map((m) => m[0]).slice(1));
}

function check(words: string[]): void {
  let cmd: Command = buildProgram();
  const rest = [...words];
  for (let sub = cmd.commands.find((c) => c.name() === rest[0]); sub; sub = cmd.commands.find((c) => c.name() === rest[0])) {
    cmd = sub;
    rest.shift();
  }
  expect(cmd.name(), words.join(' ')).not.to.equal('automation-service');
  expect(cmd.commands, `${words.join(' ')}: a command that runs`).to.have.length(0);
  for (const word of rest.filter((w) => w.startsWith('--'))) {
    const flag = word.split('=')[0]!;
    expect(
      cmd.options.some((o) => o.long === flag),
      `${cmd.name()} has ${flag}`,
    ).to.equal(true);
  }
}

describe('README CI examples', () => {
  it('the GitHub Actions workflow parses and uses only commands and options the tool has', () => {
    const workflow = yamlAfter('### In GitHub Actions') as { jobs: Record<string, { steps: { run?: string; env?: Record<string, string> }[] }> };
    const steps = Object.values(workflow.jobs).flatMap((j) => j.steps);
    const lines = toolLines(steps.flatMap((s) => (s.run ? [s.run] : [])));
    expect(lines.length).to.be.at.least(2);
    lines.forEach(check);
    expect(lines.some((l) => l[0] === 'run' && l.includes('--wait'))).to.equal(true);
    expect(steps.some((s) => s.env?.SERVICE_URL && s.env.SERVICE_API_KEY)).to.equal(true);
  });

  it('the GitLab CI job parses and uses only commands and options the tool has', () => {
    const job = Object.values(yamlAfter('### In GitLab CI') as Record<string, { script: string[] }>)[0]!;
    const lines = toolLines(job.script);
    expect(lines.length).to.be.at.least(2);
    lines.forEach(check);
  });

  it('would catch a command or an option the tool does not have', () => {
    expect(() => check(['runs', 'frobnicate', 'x'])).to.throw();
    expect(() => check(['run', '--no-such-option'])).to.throw();
  });
});

describe('the Grafana dashboard', () => {
  it('charts metrics the service exports, each with its prefix', async () => {
    const { createMetrics } = await import('../../engine/platform/index.js');
    const metrics = createMetrics({ countRuns: async () => [], queues: { all: () => [] } as never });
    const exported = new Set((await metrics.registry.getMetricsAsJSON()).map((m) => m.name));
    const dashboard = JSON.parse(fs.readFileSync(path.join(PROJECT_ROOT, 'ops', 'grafana-dashboard.json'), 'utf8')) as {
      panels: { targets: { expr: string }[] }[];
    };
    const used = dashboard.panels.flatMap((p) => p.targets.flatMap((t) => [...t.expr.matchAll(/\bautomation_[a-z_]+/g)].map((m) => m[0])));
    expect(used.length).to.be.above(8);
    for (const name of used) expect(exported.has(name.replace(/_(bucket|count|sum)$/, '')), name).to.equal(true);
  });
});
