// The built-in secret scan: secretlint's recommended rules over the gate's input files, in the
// service's process (it reads; it runs nothing of the workspace). What it finds is masked before it
// becomes an annotation, so a found secret never reaches a result, the ledger or a log.
import path from 'node:path';
import { lintSource } from '@secretlint/core';
import { secretLintProfiler } from '@secretlint/profiler';
import { creator as recommended } from '@secretlint/secretlint-rule-preset-recommend';
import { entryOf, readChunksInside } from './paths.js';
import { MAX_ANNOTATIONS, type Annotation } from './reports.js';

// secretlint 12's profiler records a performance mark per rule per file and scans every earlier one on
// each: O(n^2) in the files a process lints, and in the service's process it would grow for good. Nothing reads it;
// upstream makes it opt-in in 13 (secretlint#1673), which needs Node 22. Until then its marks are dropped.
secretLintProfiler.mark = () => {};

/** What the scan reads and lints at a time: a larger file is scanned a chunk at a time, never whole. */
const CHUNK_BYTES = 1024 * 1024;
/**
 * What a chunk shares with the one before: more than the longest secret the rules match (a private key, at
 * most 10,000 characters between its BEGIN and END lines), so that one across a border is whole in a chunk.
 */
const OVERLAP_BYTES = 64 * 1024;
/** A file larger than this is not scanned (some 10 s of linting): it is named, and the scan does not pass. */
const SCAN_MAX_BYTES = 256 * 1024 * 1024;
/** The files not scanned a summary names; the rest are counted. */
const UNSCANNED_NAMED = 10;
const CONFIG = { rules: [{ id: '@secretlint/secretlint-rule-preset-recommend', rule: recommended }] };

/** Why a scan ended before it read every file: its gate was canceled, or ran out of its time. */
export type ScanStop = 'cancelled' | 'timed_out';

class ScanStopped extends Error {
  constructor(readonly why: ScanStop) {
    super(`secret scan ${why}`);
  }
}

export type SecretScan = {
  /** set when the scan ended before it read every file (it then does not pass) */
  stopped: ScanStop | null;
  annotations: Annotation[];
  found: number;
  failed: boolean;
  scanned: number;
  /** files of the inputs that could not be scanned, each with why (too large, unreadable): the scan cannot pass */
  unscanned: string[];
};

/** One secret a scan found in a file: its rule, where (the file's line), and secretlint's message (the value masked). */
export type SecretFound = { ruleId: string; line: number; severity: string; message: string };

/**
 * One file of the workspace scanned for secrets, whatever its size or content: a large one a chunk at a time
 * (CHUNK_BYTES, each sharing OVERLAP_BYTES with the one before, so a secret across a border is found once), one
 * that looks binary (a NUL in its first 8 KB) as latin1 text, byte for byte. Each secret is handed to `found`.
 * True once scanned; null when it is not a plain file now (gone since it was listed, a link, whose target inside
 * is a file of its own, or not a file), nothing to scan; else why it could not be scanned (too large, unreadable).
 */
export async function scanFileSecrets(
  workspace: string,
  rel: string,
  found: (secret: SecretFound) => void,
  stop?: () => ScanStop | null,
): Promise<true | null | string> {
  const entry = await entryOf(workspace, rel);
  if (entry?.kind !== 'file') return null;
  if (entry.size > SCAN_MAX_BYTES) return `over ${SCAN_MAX_BYTES / (1024 * 1024)} MB`;
  const file = path.join(workspace, rel);
  /** matches already counted, by rule and offset: the chunk before saw those that end within it */
  const seen = new Set<string>();
  /** the line the chunk at `at` begins on, less one: its newlines before it */
  let linesBefore = 0;
  let previousEnd = 0;
  const read = await readChunksInside(workspace, rel, { maxBytes: SCAN_MAX_BYTES, chunkBytes: CHUNK_BYTES, overlapBytes: OVERLAP_BYTES }, async (chunk, at) => {
    const stopped = stop?.();
    if (stopped) throw new ScanStopped(stopped);
    // a file read whole that looks like text is linted as UTF-8, as before; any other chunk as latin1, a
    // character a byte, so that its offsets are the file's and its bytes all there
    const whole = at === 0 && chunk.length === entry.size;
    const text = whole && !chunk.subarray(0, 8192).includes(0) ? chunk.toString('utf8') : chunk.toString('latin1');
    if (at > 0) linesBefore -= countNewlines(chunk.subarray(0, previousEnd - at));
    const result = await lintSource({
      source: { filePath: file, content: text, contentType: 'text' },
      options: { config: CONFIG, locale: 'en', maskSecrets: true },
    });
    for (const m of result.messages) {
      if (!whole) {
        // one that ends within the overlap was the chunk before's to find (and, cut there, may have been found)
        const key = `${m.ruleId}@${at + m.range[0]}`;
        if ((at > 0 && at + m.range[1] <= previousEnd) || seen.has(key)) continue;
        seen.add(key);
      }
      found({ ruleId: m.ruleId, line: linesBefore + m.loc.start.line, severity: m.severity, message: m.message });
    }
    linesBefore += countNewlines(chunk);
    previousEnd = at + chunk.length;
  });
  return read === null ? 'unreadable' : true;
}

/**
 * What the scan found: every secret counted (`found`, `failed` when one is an error), the first
 * MAX_ANNOTATIONS kept as annotations (a file of 1 MB holds tens of thousands of tokens, and each
 * annotation was kept in the result, the ledger and every pack of it). Every plain file of the inputs is
 * scanned, whatever its size or content (scanFileSecrets: both a large file and a binary-looking one were
 * skipped, and a secret behind 1 MB of comment passed); a file that cannot be scanned is named in `unscanned`.
 */
export async function scanSecrets(workspace: string, files: string[], opts: { signal?: AbortSignal; deadline?: number } = {}): Promise<SecretScan> {
  const annotations: Annotation[] = [];
  let found = 0;
  let failed = false;
  let scanned = 0;
  const unscanned: string[] = [];
  // the scan runs in the service's process, not the sandbox: it is held to its gate's cancel and timeout between
  // chunks (a few files of 256 MB each held a gates worker's place, and the service's CPU, long after either)
  const stop = (): ScanStop | null => (opts.signal?.aborted ? 'cancelled' : opts.deadline !== undefined && Date.now() >= opts.deadline ? 'timed_out' : null);
  try {
    for (const rel of files) {
      const stopped = stop();
      if (stopped) throw new ScanStopped(stopped);
      const done = await scanFileSecrets(
        workspace,
        rel,
        (m) => {
          found++;
          if (m.severity === 'error') failed = true;
          if (annotations.length >= MAX_ANNOTATIONS) return;
          annotations.push({ path: rel, line: m.line, level: m.severity === 'error' ? 'failure' : 'warning', title: m.ruleId, message: m.message });
        },
        stop,
      );
      if (done === true) scanned++;
      else if (done !== null) unscanned.push(`${rel} (${done})`);
    }
  } catch (err) {
    if (!(err instanceof ScanStopped)) throw err;
    return { stopped: err.why, annotations, found, failed, scanned, unscanned };
  }
  return { stopped: null, annotations, found, failed, scanned, unscanned };
}

/** What a scan says of itself: what it found in how many files, and the files it could not scan. */
export function scanSummary(scan: SecretScan): string {
  const said = scan.found ? `${scan.found} secret${scan.found === 1 ? '' : 's'} found in ${scan.scanned} files` : `no secrets in ${scan.scanned} files`;
  if (!scan.unscanned.length) return said;
  const named = scan.unscanned.slice(0, UNSCANNED_NAMED).join(', ');
  const more = scan.unscanned.length > UNSCANNED_NAMED ? ` and ${scan.unscanned.length - UNSCANNED_NAMED} more` : '';
  return `${said}; ${scan.unscanned.length} not scanned, so not passed: ${named}${more}`;
}

const countNewlines = (bytes: Buffer): number => {
  let n = 0;
  for (let i = bytes.indexOf(10); i !== -1; i = bytes.indexOf(10, i + 1)) n++;
  return n;
};

/** The text with every secret the recommended rules find replaced by `***` (a gate's output, a report's message). */
export async function maskSecrets(text: string): Promise<string> {
  if (!text) return text;
  const result = await lintSource({
    source: { filePath: '/output.txt', content: text, contentType: 'text' },
    options: { config: CONFIG, locale: 'en', maskSecrets: true },
  });
  const ranges = result.messages.map((m) => m.range).sort((a, b) => b[0] - a[0]);
  let masked = text;
  for (const [start, end] of ranges) masked = `${masked.slice(0, start)}***${masked.slice(end)}`;
  return masked;
}
