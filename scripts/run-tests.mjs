// `npm test`: the suite in two parts, so that it stays within five minutes on two cores. Most spec
// files run in parallel (mocha --parallel, three workers: they wait more than they compute, the suite's CPU was
// 428 s in 7 min 10 s with two, about one core busy; three took that part from 347 s to 281 s on 2026-11-30,
// and passed beside a busy loop taking a whole core; two from 2026-11-29, when three runs in a row on a slower
// machine each failed a different time bound, bounds of work since measured in CPU time, test/support/cpu.ts). The files that hold the service to its tightest time bounds (an
// answer within 2 s while Redis is down, a budget that ends an agent run within 3 s, a process's exit within its grace)
// run before them, apart from the rest, so another file's load cannot make them lie. The closing line CI reads adds both parts up: `N passed, N failed, N skipped`.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const mocha = path.join(root, 'node_modules', 'mocha', 'bin', 'mocha.js');
/** measured against a time bound: run alone (files that start servers on ports chosen in advance run in
 * parallel: freePort draws them below the kernel's ephemeral range, where no other file's server or client takes them).
 * process.test.ts since 2026-11-29: its processes must exit within a grace period of 2 or 3 s, and under the other
 * files' load on a slower machine their timers fired up to 1.4 s late (2 failures in 4 runs of the suite there) */
const ALONE = ['test/e2e/redis-outage.test.ts', 'test/e2e/agent.test.ts', 'test/e2e/api-keys.test.ts', 'test/e2e/process.test.ts'];
const JOBS = process.env.TEST_JOBS ?? '3';
/** every spec file (.mocharc.json names none: this script gives them) */
const SPEC = ['test/unit/**/*.test.ts', 'test/integration/**/*.test.ts', 'test/e2e/**/*.test.ts'];
const SUMMARY = /^(\d+) passed, (\d+) failed, (\d+) skipped$/m;

/** Runs mocha with the project's .mocharc.json and these arguments; echoes its output; its counts. */
function run(name, args) {
  const started = Date.now();
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [mocha, ...args, ...process.argv.slice(2)], { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.on('data', (d) => {
      out += d;
      process.stdout.write(d);
    });
    child.on('close', (code) => {
      const m = SUMMARY.exec(out.trimEnd().split('\n').at(-1) ?? '');
      process.stdout.write(`test: ${name} took ${((Date.now() - started) / 1000).toFixed(1)} s\n`);
      // no summary at all (mocha could not start): a failure of its own
      resolve(m ? { passed: +m[1], failed: +m[2], skipped: +m[3], code } : { passed: 0, failed: 1, skipped: 0, code: code || 1 });
    });
  });
}

// the timing-bound files first, on a machine nothing else has warmed or left busy (a file's leftover processes)
// (side by side with each other: together they keep less than one core busy, mostly waiting on the outages they make)
const parts = [
  await run('the time-bound files', ['--parallel', '--jobs', String(ALONE.length), ...ALONE]),
  await run('the rest', ['--parallel', '--jobs', JOBS, ...SPEC, ...ALONE.flatMap((f) => ['--ignore', f])]),
];
const total = parts.reduce((a, p) => ({ passed: a.passed + p.passed, failed: a.failed + p.failed, skipped: a.skipped + p.skipped }), {
  passed: 0,
  failed: 0,
  skipped: 0,
});
process.stdout.write(`\n${total.passed} passed, ${total.failed} failed, ${total.skipped} skipped\n`);
process.exit(parts.some((p) => p.code !== 0) || total.failed ? 1 : 0);
