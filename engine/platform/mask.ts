// A credential masked wherever a provider's answer, or a tool's output, gives it back: in a reason, an error, a
// step's output. Shared by the connections' reasons and the tools that run with a credential (a checkout).

/** The shortest piece of a credential that is masked wherever it appears. */
const PART = 12;

/** The fewest characters of a run of base64 that can carry a credential (12 characters encode to 16). */
const BASE64_MIN = 16;

/**
 * `text` with the credential masked wherever it appears: as it is, with its whitespace folded (a credential with a
 * newline in it), any part of it long enough to tell (12 characters), and encoded as the service sends it (HTTP
 * Basic's `x-access-token:<token>`, SMTP AUTH PLAIN's `\0user\0password`): a run of base64 whose text holds it, or
 * a part of it, is masked whole. A provider that echoes what it was sent (a git host's error, an SMTP server's 535)
 * gave the credential back in base64, which the plain forms did not catch.
 */
export function maskCredential(text: string, secret: string): string {
  if (!secret) return text;
  const forms = [...new Set([secret, secret.replace(/\s+/g, ' ').trim()])].filter(Boolean);
  const pieces = piecesOf(forms);
  // a form shorter than a piece is found whole; a longer one is covered by its pieces
  const short = forms.filter((f) => f.length < PART);
  let masked = maskRuns(text, runsOf(text, pieces, short));
  const holds = (decoded: string) => forms.some((f) => decoded.includes(f)) || runsOf(decoded, pieces, [], true).length > 0;
  masked = maskBase64Runs(masked, false, BASE64_MIN, (run) => holds(Buffer.from(run, 'base64').toString('latin1')));
  // a short credential's base64 is shorter than BASE64_MIN (AUTH LOGIN's password line alone): its own characters
  const cores = forms.flatMap(base64Cores);
  if (!cores.length) return masked;
  const shortest = Math.min(...cores.map((c) => c.length));
  return maskBase64Runs(masked, true, shortest, (run) => cores.some((c) => run.includes(c)));
}

/**
 * `text`, a window cut from the start of a longer text, with the credential masked as maskCredential masks it, and
 * an end that is the start of the credential (cut there, it is shorter than any piece maskCredential knows, or
 * than the credential itself) masked too: a reason shown from such a window ended in `ghp_ABCDEFG`.
 */
export function maskCredentialCut(text: string, secret: string): string {
  if (!secret) return text;
  let cut = 0;
  for (const form of new Set([secret, secret.replace(/\s+/g, ' ').trim()])) cut = Math.max(cut, endThatStarts(text, form));
  return maskCredential(cut ? `${text.slice(0, text.length - cut)}[credential]` : text, secret);
}

/**
 * The first `end` characters of `text`, the credential masked: as maskCredentialCut when they stop before the text
 * does (the window may end in the credential's start), else as maskCredential. A reason, a provider's answer.
 */
export function maskCredentialWindow(text: string, end: number, secret: string): string {
  const taken = text.slice(0, end);
  return end < text.length ? maskCredentialCut(taken, secret) : maskCredential(taken, secret);
}

/**
 * How long the longest end of `text` is that is the start of `form` (shorter than `form`: a whole one is
 * maskCredential's), in one pass (Knuth-Morris-Pratt over the end of `text` as long as `form`).
 */
function endThatStarts(text: string, form: string): number {
  if (form.length < 2) return 0;
  // fail[i]: the longest proper start of form[0..i] that is also its end
  const fail = new Int32Array(form.length);
  for (let i = 1, k = 0; i < form.length; i++) {
    while (k > 0 && form[i] !== form[k]) k = fail[k - 1]!;
    if (form[i] === form[k]) k++;
    fail[i] = k;
  }
  let k = 0;
  for (let i = Math.max(0, text.length - form.length + 1); i < text.length; i++) {
    while (k > 0 && text[i] !== form[k]) k = fail[k - 1]!;
    if (text[i] === form[k]) k++;
    // a whole form is maskCredential's, and only a proper start counts here
    if (k === form.length) k = fail[k - 1]!;
  }
  return k;
}

/** Whether a character is standard base64's (A-Z, a-z, 0-9, +, /), or with `urlSafe`, url-safe base64's as well (-, _). */
function isBase64(c: number, urlSafe: boolean): boolean {
  return (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || (c >= 48 && c <= 57) || c === 43 || c === 47 || (urlSafe && (c === 45 || c === 95));
}

/**
 * `text` with each run of base64 (its characters, then at most two `=`) of at least `min` characters before its
 * padding that `holds` replaced by `[credential]`. Read in one pass: `/[A-Za-z0-9+/]{16,}={0,2}/g` was tried again
 * from each character of every shorter run, and a callback for each run of a 4 MB text cost more than the rest.
 */
function maskBase64Runs(text: string, urlSafe: boolean, min: number, holds: (run: string) => boolean): string {
  const out: string[] = [];
  let from = 0;
  for (let i = 0; i < text.length;) {
    if (!isBase64(text.charCodeAt(i), urlSafe)) {
      i++;
      continue;
    }
    const start = i;
    while (i < text.length && isBase64(text.charCodeAt(i), urlSafe)) i++;
    const chars = i - start;
    for (let pad = 0; pad < 2 && text.charCodeAt(i) === 61; pad++) i++;
    if (chars >= min && holds(text.slice(start, i))) {
      out.push(text.slice(from, start), '[credential]');
      from = i;
    }
  }
  if (!out.length) return text;
  out.push(text.slice(from));
  return out.join('');
}

/** A rolling hash's base (an odd multiplier); hashes are taken modulo 2^32 (Math.imul, | 0). */
const BASE = 0x01000193;
/** BASE to the power PART - 1: what the character leaving a window weighs in its hash. */
const LEAVING = Array.from({ length: PART - 1 }).reduce<number>((h) => Math.imul(h, BASE), 1);

/**
 * The PART-long pieces of the credential, each with where it starts in a form of it, and a table of their rolling
 * hashes (a window whose hash is not marked is no piece; a Set of the hashes took 50 ns a window).
 */
type Pieces = { at: Map<string, [form: string, offset: number]>; marked: Uint8Array; mask: number };

/** Every PART-long piece of the forms, and their rolling hashes marked in a table (about 1 in 64 of it marked). */
function piecesOf(forms: string[]): Pieces {
  const at = new Map<string, [string, number]>();
  for (const form of forms) for (let i = 0; i + PART <= form.length; i++) if (!at.has(form.slice(i, i + PART))) at.set(form.slice(i, i + PART), [form, i]);
  let size = 1024;
  while (size < at.size * 64 && size < 1 << 20) size *= 2;
  const marked = new Uint8Array(size);
  for (const piece of at.keys()) marked[hashOf(piece, 0) & (size - 1)] = 1;
  return { at, marked, mask: size - 1 };
}

/** The rolling hash of the PART characters of `text` from `start`. */
function hashOf(text: string, start: number): number {
  let h = 0;
  for (let i = start; i < start + PART; i++) h = (Math.imul(h, BASE) + text.charCodeAt(i)) | 0;
  return h;
}

/** A run of `text` to mask: [start, end). */
type Run = [number, number];

/**
 * Where in `text` the credential is, as runs in order, overlapping ones merged: every PART-long window that is a
 * piece of it, and every place a short form of it appears whole. Each window is hashed once, rolling, and only one
 * whose hash is a piece's is compared as text; a match is followed along the form as far as it goes, and the
 * windows inside it are not looked at again. One pass, however long the credential: splitting the text once per
 * piece took a pass per character of an 8 KB credential, seconds for a text of a few MB. `first`: stop at the
 * first run found.
 */
function runsOf(text: string, pieces: Pieces, short: string[], first = false): Run[] {
  const windows: Run[] = [];
  const { at, marked, mask } = pieces;
  const length = text.length;
  if (at.size) {
    let start = 0;
    let h = length >= PART ? hashOf(text, 0) : 0;
    while (start + PART <= length) {
      const found = marked[h & mask] ? at.get(text.slice(start, start + PART)) : undefined;
      if (found) {
        const [form, offset] = found;
        let end = start + PART;
        while (end < length && offset + end - start < form.length && text.charCodeAt(end) === form.charCodeAt(offset + end - start)) end++;
        if (first) return [[start, end]];
        add(windows, [start, end]);
        // the windows inside [start, end) are pieces of the form; the next that may not be starts PART - 1 before its end
        const next = Math.max(start + 1, end - PART + 1);
        if (next + PART > length) break;
        if (next !== start + 1) {
          start = next;
          h = hashOf(text, start);
          continue;
        }
      } else if (start + PART >= length) break;
      // int32 arithmetic (| 0): kept a small integer, never a number on the heap
      h = (Math.imul(h - Math.imul(text.charCodeAt(start), LEAVING), BASE) + text.charCodeAt(start + PART)) | 0;
      start++;
    }
  }
  const lists = [windows];
  for (const form of short) {
    const list: Run[] = [];
    for (let at = text.indexOf(form); at !== -1; at = text.indexOf(form, at + form.length)) {
      if (first) return [[at, at + form.length]];
      list.push([at, at + form.length]);
    }
    lists.push(list);
  }
  if (lists.every((l, i) => i === 0 || !l.length)) return windows;
  // a few lists, each in order: merged in order
  const runs: Run[] = [];
  const heads = lists.map(() => 0);
  for (;;) {
    let pick = -1;
    for (let i = 0; i < lists.length; i++)
      if (heads[i]! < lists[i]!.length && (pick < 0 || lists[i]![heads[i]!]![0] < lists[pick]![heads[pick]!]![0])) pick = i;
    if (pick < 0) return runs;
    add(runs, lists[pick]![heads[pick]!++]!);
  }
}

/** Adds a run found at or after the last one's start, merged with it where they overlap. */
function add(runs: Run[], run: Run): void {
  const last = runs.at(-1);
  // overlapping only: two occurrences side by side are two, as splitting on the credential made them
  if (last && run[0] < last[1]) last[1] = Math.max(last[1], run[1]);
  else runs.push([run[0], run[1]]);
}

/** `text` with each run replaced by `[credential]`. */
function maskRuns(text: string, runs: Array<[number, number]>): string {
  if (!runs.length) return text;
  const out: string[] = [];
  let from = 0;
  for (const [start, end] of runs) {
    out.push(text.slice(from, start), '[credential]');
    from = end;
  }
  out.push(text.slice(from));
  return out.join('');
}

/** The fewest characters of a credential's base64 that are told apart from any other text's. */
const CORE_MIN = 6;

/**
 * The base64 characters that `secret` alone decides, wherever it sits in what is encoded: at each of the three
 * places it can start in a group of three bytes (`\0user\0pass`, `user:pass`, the password alone), standard and
 * url-safe. The first characters of a group it starts within and the last of the group it ends within also hold
 * what comes before and after, so they are left out; what is left appears in any encoding that holds the secret.
 */
function base64Cores(secret: string): string[] {
  const bytes = Buffer.from(secret, 'utf8');
  const cores: string[] = [];
  for (const lead of [0, 1, 2]) {
    const encoded = Buffer.concat([Buffer.alloc(lead), bytes, Buffer.alloc(2)]).toString('base64');
    // characters of whole bytes of the secret: from the first that holds no byte before it, to the last that holds none after
    const from = lead === 0 ? 0 : lead + 1;
    const to = Math.floor(((lead + bytes.length) * 8) / 6);
    const core = encoded.slice(from, to);
    if (core.length >= CORE_MIN) cores.push(core, core.replace(/\+/g, '-').replace(/\//g, '_'));
  }
  return [...new Set(cores)];
}
