// `npm test`: the suite in two parts, so that it stays within five minutes on two cores. Most spec
// files run in parallel (mocha --parallel, three workers, or two on a slow machine: SLOW_FIRST_PART_S below;
// bounds of work are measured in CPU time, test/support/cpu.ts). The files that hold the service to its tightest time bounds (an
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
/**
 * The rest's workers, unless TEST_JOBS says: three, or two on a machine the first part finds slow. Three took the
 * rest from 347 s to 281 s on 2026-11-30 (the files wait more than they compute: with two, about one core was
 * busy) and passed beside a busy loop taking a whole core; the first part took 44-54 s there, 51 s beside the
 * loop, and 78 s on a slower machine the day before (before 15 s of its tests' waits went). On a slower machine
 * still (2026-11-29, a twenty-fourth), three runs in a row with three workers each failed a different time bound.
 */
const SLOW_FIRST_PART_S = 65;
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
      const seconds = (Date.now() - started) / 1000;
      process.stdout.write(`test: ${name} took ${seconds.toFixed(1)} s\n`);
      // no summary at all (mocha could not start): a failure of its own
      resolve({ ...(m ? { passed: +m[1], failed: +m[2], skipped: +m[3], code } : { passed: 0, failed: 1, skipped: 0, code: code || 1 }), seconds });
    });
  });
}

// the timing-bound files first, on a machine nothing else has warmed or left busy (a file's leftover processes)
// (side by side with each other: together they keep less than one core busy, mostly waiting on the outages they make)
const first = await run('the time-bound files', ['--parallel', '--jobs', String(ALONE.length), ...ALONE]);
const jobs = process.env.TEST_JOBS ?? (first.seconds > SLOW_FIRST_PART_S ? '2' : '3');
process.stdout.write(`test: the rest with ${jobs} mocha workers${process.env.TEST_JOBS ? ' (TEST_JOBS)' : ''}\n`);
const parts = [first, await run('the rest', ['--parallel', '--jobs', jobs, ...SPEC, ...ALONE.flatMap((f) => ['--ignore', f])])];
const total = parts.reduce((a, p) => ({ passed: a.passed + p.passed, failed: a.failed + p.failed, skipped: a.skipped + p.skipped }), {
  passed: 0,
  failed: 0,
  skipped: 0,
});
process.stdout.write(`\n${total.passed} passed, ${total.failed} failed, ${total.skipped} skipped\n`);
process.exit(parts.some((p) => p.code !== 0) || total.failed ? 1 : 0);
