// Reading what test and lint tools report: TAP (tap-parser), JUnit XML (fast-xml-parser), ESLint's
// JSON formatter and `tsc`'s own output. Each gives whether the report holds a failure and the
// annotations (file, line, level, message) a check run shows beside the code.
import path from 'node:path';
import { XMLParser } from 'fast-xml-parser';
import { Parser as TapParser } from 'tap-parser';
import type { ReportFormat } from './definition.js';

import type { Annotation } from '../platform/index.js';
export type { Annotation };

export type Report = { ok: boolean; annotations: Annotation[]; summary: string };

const MAX_ANNOTATIONS = 200;
/** An annotation's message, title and path are cut here: a report's one 7 MB message was kept three times. */
const MAX_ANNOTATION_CHARS = 1000;

const clipped = (a: Annotation): Annotation => {
  const cut = <T extends string | null | undefined>(s: T): T =>
    typeof s === 'string' && s.length > MAX_ANNOTATION_CHARS ? (s.slice(0, MAX_ANNOTATION_CHARS) as T) : s;
  return { ...a, message: cut(a.message), ...('title' in a ? { title: cut(a.title) } : {}), path: cut(a.path) };
};

/** Reads a report; `workspace` makes absolute paths relative. A report that cannot be read is `ok: false`. */
export async function parseReport(format: ReportFormat, text: string, workspace: string): Promise<Report> {
  const rel = (p: string | undefined | null) => {
    if (!p) return null;
    const relative = path.isAbsolute(p) ? path.relative(workspace, p) : p;
    return relative.startsWith('..') ? p : relative.split(path.sep).join('/');
  };
  try {
    const report = format === 'tap' ? await tap(text) : format === 'junit' ? junit(text, rel) : format === 'eslint' ? eslint(text, rel) : tsc(text, rel);
    return { ...report, annotations: report.annotations.slice(0, MAX_ANNOTATIONS).map(clipped) };
  } catch (err) {
    // not the parser's message: it can quote the report's bytes
    void err;
    return { ok: false, annotations: [], summary: `the ${format} report could not be read` };
  }
}

function tap(text: string): Promise<Report> {
  return new Promise((resolve) => {
    const annotations: Annotation[] = [];
    const parser = new TapParser();
    parser.on('assert', (a: { ok: boolean; name?: string; id?: number; skip?: unknown; todo?: unknown; diag?: Record<string, unknown> }) => {
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
    parser.on('complete', (r: { ok: boolean; count: number; pass: number; fail: number; plan?: { end?: number } }) => {
      const ok = r.ok && r.count > 0;
      resolve({ ok, annotations, summary: r.count ? `${r.pass} of ${r.count} passed${r.fail ? `, ${r.fail} failed` : ''}` : 'no tests in the TAP report' });
    });
    parser.end(text);
  });
}

type Rel = (p: string | undefined | null) => string | null;

function junit(text: string, rel: Rel): Report {
  const doc = new XMLParser({
    ignoreAttributes: false,
    attributeNamePrefix: '',
    isArray: (name) => ['testsuite', 'testcase', 'failure', 'error'].includes(name),
  }).parse(text) as Record<string, unknown>;
  const root = (doc.testsuites ?? doc) as { testsuite?: Record<string, unknown>[] };
  if (!root.testsuite?.length) throw new Error('no <testsuite> in the JUnit report');
  // suites nest (PHPUnit, pytest's xunit2, Gradle): every suite at every depth, a case counted once
  const suites: Record<string, unknown>[] = [];
  for (let i = 0, next = [...root.testsuite]; i < next.length; i++) {
    suites.push(next[i]!);
    next.push(...((next[i]!.testsuite ?? []) as Record<string, unknown>[]));
  }
  const annotations: Annotation[] = [];
  let count = 0;
  for (const suite of suites) {
    for (const tc of (suite.testcase ?? []) as Record<string, unknown>[]) {
      count++;
      for (const f of [...((tc.failure ?? []) as unknown[]), ...((tc.error ?? []) as unknown[])]) {
        const message = typeof f === 'string' ? f : ((f as Record<string, string>).message ?? (f as Record<string, string>)['#text'] ?? 'failed');
        annotations.push({
          path: rel((tc.file as string | undefined) ?? (suite.file as string | undefined)),
          line: tc.line ? Number(tc.line) : null,
          level: 'failure',
          title: `${String(tc.classname ?? suite.name ?? '')} ${String(tc.name ?? '')}`.trim(),
          message: String(message).split('\n')[0]!.slice(0, 1000),
        });
      }
    }
  }
  return { ok: annotations.length === 0 && count > 0, annotations, summary: `${count - annotations.length} of ${count} passed` };
}

function eslint(text: string, rel: Rel): Report {
  const results = JSON.parse(text) as { filePath: string; messages: { line?: number; severity: number; message: string; ruleId?: string | null }[] }[];
  if (!Array.isArray(results)) throw new Error('the ESLint report is not an array of results');
  const annotations: Annotation[] = results.flatMap((r) =>
    r.messages.map((m) => ({
      path: rel(r.filePath),
      line: m.line ?? null,
      level: m.severity >= 2 ? ('failure' as const) : ('warning' as const),
      message: m.ruleId ? `${m.message} (${m.ruleId})` : m.message,
    })),
  );
  const errors = annotations.filter((a) => a.level === 'failure').length;
  return {
    ok: errors === 0,
    annotations,
    summary: `${errors} error${errors === 1 ? '' : 's'}, ${annotations.length - errors} warning${annotations.length - errors === 1 ? '' : 's'}`,
  };
}

function tsc(text: string, rel: Rel): Report {
  const annotations: Annotation[] = [];
  for (const line of text.split('\n')) {
    const m = /^(.+?)\((\d+),(\d+)\): (error|warning) (TS\d+): (.*)$/.exec(line.trim());
    if (m) annotations.push({ path: rel(m[1]), line: Number(m[2]), level: m[4] === 'error' ? 'failure' : 'warning', message: `${m[5]}: ${m[6]}` });
    else if (/^error (TS\d+): /.test(line.trim())) annotations.push({ path: null, line: null, level: 'failure', message: line.trim().slice(6) });
  }
  const errors = annotations.filter((a) => a.level === 'failure').length;
  return { ok: errors === 0, annotations, summary: errors ? `${errors} type error${errors === 1 ? '' : 's'}` : 'no type errors' };
}
