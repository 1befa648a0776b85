// Reading what test and lint tools report: TAP (tap-parser), JUnit XML (fast-xml-parser), ESLint's
// JSON formatter and `tsc`'s own output. Each gives whether the report holds a failure and the
// annotations (file, line, level, message) a check run shows beside the code.
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Worker } from 'node:worker_threads';
import { XMLParser, XMLValidator } from 'fast-xml-parser';
import { Parser as TapParser } from 'tap-parser';
import type { ReportFormat } from './definition.js';

import type { Annotation } from '../platform/index.js';
export type { Annotation };

export type Report = { ok: boolean; annotations: Annotation[]; summary: string };

export const MAX_ANNOTATIONS = 200;
/** An annotation's message, title and path are cut here: a report's one 7 MB message was kept three times. */
const MAX_ANNOTATION_CHARS = 1000;

/**
 * What all the annotations of a report hold together (message, title and path): those past it are left out.
 * 200 of 3,000 characters each made 600 KB a gate, copied into the gate run, the ledger and every pack of
 * it (50 gates a set: 30 MB a gate run, read whole by every readiness snapshot and pack).
 */
const MAX_ANNOTATIONS_CHARS = 64 * 1024;

/** The annotations, in order, as many as fit MAX_ANNOTATIONS_CHARS (at least the first). */
function withinBudget(annotations: Annotation[]): Annotation[] {
  let used = 0;
  const out: Annotation[] = [];
  for (const a of annotations) {
    used += a.message.length + (a.title?.length ?? 0) + (a.path?.length ?? 0);
    if (used > MAX_ANNOTATIONS_CHARS && out.length) break;
    out.push(a);
  }
  return out;
}

/** The annotations a result keeps: the first MAX_ANNOTATIONS, each clipped, within MAX_ANNOTATIONS_CHARS together. */
export const keptAnnotations = (annotations: Annotation[]): Annotation[] => withinBudget(annotations.slice(0, MAX_ANNOTATIONS).map(clipped));

const clipped = (a: Annotation): Annotation => {
  const cut = <T extends string | null | undefined>(s: T): T =>
    typeof s === 'string' && s.length > MAX_ANNOTATION_CHARS ? (s.slice(0, MAX_ANNOTATION_CHARS) as T) : s;
  return { ...a, message: cut(a.message), ...('title' in a ? { title: cut(a.title) } : {}), path: cut(a.path) };
};

/** Reads a report; `workspace` makes absolute paths relative. A report that cannot be read is `ok: false`. */
/** Reports larger than this are read on a thread of their own (see report-thread.ts): a thread costs tens of milliseconds to start. */
const THREAD_FROM_BYTES = 512 * 1024;
const here = fileURLToPath(import.meta.url);
const threadEntry = pathToFileURL(path.join(path.dirname(here), `report-thread${path.extname(here)}`)).href;
/**
 * What the thread runs: the thread's module, `.js` once built; under tsx (development and tests) its `.ts`,
 * after tsx's loader is registered in the thread (a thread does not inherit it, nor take it from execArgv)
 */
const threadCode =
  path.extname(here) === '.ts'
    ? `import(${JSON.stringify(import.meta.resolve('tsx/esm/api'))}).then((tsx) => tsx.register()).then(() => import(${JSON.stringify(threadEntry)}))`
    : `import(${JSON.stringify(threadEntry)})`;

/** A report read, on a thread of its own when it is large, so the process's event loop goes on meanwhile. */
export async function readReport(format: ReportFormat, text: string, workspace: string): Promise<Report> {
  if (text.length < THREAD_FROM_BYTES) return parseReport(format, text, workspace);
  const thread = new Worker(threadCode, { eval: true, workerData: { format, text, workspace } });
  try {
    return await new Promise<Report>((resolve, reject) => {
      thread.once('message', resolve);
      thread.once('error', reject);
      thread.once('exit', (code) => reject(new Error(`the report thread exited ${code}`)));
    });
  } catch {
    return { ok: false, annotations: [], summary: `the ${format} report could not be read` };
  } finally {
    void thread.terminate();
  }
}

export async function parseReport(format: ReportFormat, text: string, workspace: string): Promise<Report> {
  const rel = (p: string | undefined | null) => {
    if (!p) return null;
    const relative = path.isAbsolute(p) ? path.relative(workspace, p) : p;
    return relative.startsWith('..') ? p : relative.split(path.sep).join('/');
  };
  try {
    const report = format === 'tap' ? await tap(text) : format === 'junit' ? junit(text, rel) : format === 'eslint' ? eslint(text, rel) : tsc(text, rel);
    return { ...report, annotations: keptAnnotations(report.annotations) };
  } catch (err) {
    // not the parser's message: it can quote the report's bytes
    void err;
    return { ok: false, annotations: [], summary: `the ${format} report could not be read` };
  }
}

function tap(text: string): Promise<Report> {
  return new Promise((resolve) => {
    const annotations: Annotation[] = [];
    // the test points by what became of them (the parser counts a skipped one as passed)
    const points = { passed: 0, failed: 0, skipped: 0, todo: 0 };
    const parser = new TapParser();
    parser.on('assert', (a: { ok: boolean; name?: string; id?: number; skip?: unknown; todo?: unknown; diag?: Record<string, unknown> }) => {
      if (a.skip) points.skipped++;
      else if (a.todo) points.todo++;
      else if (a.ok) points.passed++;
      else points.failed++;
      if (a.ok || a.skip || a.todo) return;
      const at = a.diag?.at as { fileName?: string; lineNumber?: number } | string | undefined;
      const where = typeof at === 'string' ? /^(.*?):(\d+)/.exec(at) : null;
      annotations.push({
        path: typeof at === 'object' ? (at.fileName ?? null) : (where?.[1] ?? null),
        line: typeof at === 'object' ? (at.lineNumber ?? null) : where ? Number(where[2]) : null,
        level: 'failure',
        message: `not ok ${a.id ?? ''} ${a.name ?? ''}`.trim(),
      });
    });
    parser.on(
      'complete',
      (r: {
        ok: boolean;
        count: number;
        pass: number;
        fail: number;
        bailout?: string | boolean;
        plan?: { end?: number | null };
        failures?: { tapError?: string }[];
      }) => {
        const ok = r.ok && r.count > 0;
        // what failed the stream as a whole, not one test: a bail out (`true` when it gave no reason), no
        // plan, fewer tests than planned, an id used twice (the parser lists such an error once per use)
        const whole = new Set([
          ...(r.bailout !== undefined && r.bailout !== false ? [`bailed out${typeof r.bailout === 'string' && r.bailout ? `: ${r.bailout}` : ''}`] : []),
          ...(r.failures ?? []).flatMap((f) =>
            f.tapError === 'incorrect number of tests'
              ? [`the plan says ${r.plan?.end ?? '?'} tests; ${r.count} reported`]
              : f.tapError === 'no plan'
                ? ['the report has no plan (1..N): it may have been cut off']
                : f.tapError
                  ? [f.tapError]
                  : [],
          ),
        ]);
        for (const message of whole) annotations.push({ path: null, line: null, level: 'failure', message });
        resolve({
          ok,
          annotations,
          summary: r.count
            ? `${points.passed} of ${r.count} passed` +
              (points.failed ? `, ${points.failed} failed` : '') +
              (points.skipped ? `, ${points.skipped} skipped` : '') +
              (points.todo ? `, ${points.todo} to do` : '') +
              (whole.size ? `; ${[...whole].join('; ')}` : '')
            : 'no tests in the TAP report',
        });
      },
    );
    parser.end(text);
  });
}

type Rel = (p: string | undefined | null) => string | null;

/**
 * JUnit XML, as the many tools that write it do: suites nest (PHPUnit, pytest's xunit2, Gradle), a suite
 * may hold an error of its own (its set-up or collection failed) and says how many of its cases failed.
 * A report that is not whole XML (cut off while it was written) cannot be read, and one whose suites count
 * more failures and errors than their cases show has failed: a gate never passes on what it could not see.
 */
function junit(text: string, rel: Rel): Report {
  if (XMLValidator.validate(text) !== true) throw new Error('the JUnit report is not well-formed XML');
  const doc = new XMLParser({
    ignoreAttributes: false,
    attributeNamePrefix: '',
    isArray: (name) => ['testsuite', 'testcase', 'failure', 'error'].includes(name),
  }).parse(text) as Record<string, unknown>;
  const root = (doc.testsuites ?? doc) as Suite;
  if (!root.testsuite?.length) throw new Error('no <testsuite> in the JUnit report');
  const annotations: Annotation[] = [];
  let count = 0;
  let skipped = 0;
  let failedCases = 0;
  /** failures and errors found outside the test cases: a suite's own, or only in a suite's count */
  let outside = 0;
  const problems = (x: Suite | Case) => [...(x.failure ?? []), ...(x.error ?? [])];
  const messageOf = (f: unknown) =>
    String(typeof f === 'string' ? f : ((f as Record<string, string>).message ?? (f as Record<string, string>)['#text'] ?? 'failed'));
  const declared = (x: Suite) => (Number(x.failures) || 0) + (Number(x.errors) || 0);
  const annotate = (title: string, file: unknown, line: unknown, message: string) =>
    annotations.push({
      path: rel(file as string | undefined),
      line: line ? Number(line) : null,
      level: 'failure',
      title,
      message: message.split('\n')[0]!.slice(0, 1000),
    });
  /** a suite's failures and errors at every depth below it, each annotated once */
  const read = (suite: Suite): number => {
    let found = 0;
    const casesBefore = count;
    for (const f of problems(suite)) {
      found++;
      outside++;
      annotate(`${String(suite.name ?? 'suite')} (the suite itself)`, suite.file, null, messageOf(f));
    }
    for (const tc of suite.testcase ?? []) {
      count++;
      const failures = problems(tc);
      if (failures.length) failedCases++;
      else if (tc.skipped !== undefined) skipped++;
      for (const f of failures) {
        found++;
        annotate(`${String(tc.classname ?? suite.name ?? '')} ${String(tc.name ?? '')}`.trim(), tc.file ?? suite.file, tc.line, messageOf(f));
      }
    }
    for (const inner of suite.testsuite ?? []) found += read(inner);
    // more tests counted than the report shows: the rest (and what they did) were cut away
    const shown = count - casesBefore;
    if ((Number(suite.tests) || 0) > shown)
      annotate(String(suite.name ?? 'suite'), suite.file, null, `the suite reports ${Number(suite.tests)} tests; it shows ${shown}`);
    if (declared(suite) > found) {
      outside += declared(suite) - found;
      annotate(String(suite.name ?? 'suite'), suite.file, null, `the suite reports ${declared(suite)} failures and errors; its test cases show ${found}`);
      found = declared(suite);
    }
    return found;
  };
  let found = 0;
  for (const suite of root.testsuite) found += read(suite);
  if (root !== (doc as Suite) && (Number(root.tests) || 0) > count)
    annotate('testsuites', null, null, `the report counts ${Number(root.tests)} tests; its suites show ${count}`);
  if (root !== (doc as Suite) && declared(root) > found) {
    outside += declared(root) - found;
    annotate('testsuites', null, null, `the report counts ${declared(root)} failures and errors; its suites show ${found}`);
  }
  return {
    ok: annotations.length === 0 && count > 0,
    annotations,
    summary:
      `${count - failedCases - skipped} of ${count} passed` +
      (skipped ? `, ${skipped} skipped` : '') +
      (outside ? `, ${outside} failures and errors outside the test cases` : ''),
  };
}

type Case = { name?: unknown; classname?: unknown; file?: unknown; line?: unknown; skipped?: unknown; failure?: unknown[]; error?: unknown[] };
type Suite = {
  name?: unknown;
  tests?: unknown;
  file?: unknown;
  failures?: unknown;
  errors?: unknown;
  testsuite?: Suite[];
  testcase?: Case[];
  failure?: unknown[];
  error?: unknown[];
};

function eslint(text: string, rel: Rel): Report {
  const results = JSON.parse(text) as {
    filePath: string;
    errorCount?: number;
    messages: { line?: number; severity: number; message: string; ruleId?: string | null }[];
  }[];
  if (!Array.isArray(results)) throw new Error('the ESLint report is not an array of results');
  const annotations: Annotation[] = results.flatMap((r) =>
    r.messages.map((m) => ({
      path: rel(r.filePath),
      line: m.line ?? null,
      level: m.severity >= 2 ? ('failure' as const) : ('warning' as const),
      message: m.ruleId ? `${m.message} (${m.ruleId})` : m.message,
    })),
  );
  // a file that counts errors its messages do not show (a formatter that dropped them) has them all the same
  for (const r of results) {
    const shown = r.messages.filter((m) => m.severity >= 2).length;
    if (typeof r.errorCount === 'number' && r.errorCount > shown)
      annotations.push({
        path: rel(r.filePath),
        line: null,
        level: 'failure',
        message: `the report counts ${r.errorCount} errors in this file; it shows ${shown}`,
      });
  }
  const errors = annotations.filter((a) => a.level === 'failure').length;
  return {
    ok: errors === 0,
    annotations,
    summary: `${errors} error${errors === 1 ? '' : 's'}, ${annotations.length - errors} warning${annotations.length - errors === 1 ? '' : 's'}`,
  };
}

function tsc(text: string, rel: Rel): Report {
  const annotations: Annotation[] = [];
  for (const line of text.replace(/\u001b\[[0-9;]*m/g, '').split('\n')) {
    // tsc's plain form, file(line,col): error TS…, and its --pretty form, file:line:col - error TS…
    const m =
      /^(.+?)\((\d+),(\d+)\): (error|warning) (TS\d+): (.*)$/.exec(line.trim()) ?? /^(.+?):(\d+):(\d+) - (error|warning) (TS\d+): (.*)$/.exec(line.trim());
    if (m) annotations.push({ path: rel(m[1]), line: Number(m[2]), level: m[4] === 'error' ? 'failure' : 'warning', message: `${m[5]}: ${m[6]}` });
    else if (/^error (TS\d+): /.test(line.trim())) annotations.push({ path: null, line: null, level: 'failure', message: line.trim().slice(6) });
  }
  const errors = annotations.filter((a) => a.level === 'failure').length;
  return { ok: errors === 0, annotations, summary: errors ? `${errors} type error${errors === 1 ? '' : 's'}` : 'no type errors' };
}
