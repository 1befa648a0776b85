// The globs of file_change triggers, matched without regular expressions. A glob turned into a
// backtracking regular expression (picomatch's way) takes time exponential in its wildcards: a tenant's
// `*([a-z]|a)*([a-z]|a)…b`, or `*a*a*a…b`, against a file name of a few dozen letters held the watching
// process for minutes. Here a path is matched segment by segment, each segment by the two-pointer
// wildcard walk, so a match costs at most the glob's length times the path's.
//
// What a glob may say (picomatch's with `dot: true`, less its regular-expression parts): `*` (any
// characters but `/`, dot files too), `**` as a whole segment (any number of folders), `?` (one
// character), `[abc]`, `[a-z]`, `[!a]` / `[^a]`, `{a,b}` and `{1..5}` (expanded), `\` to escape, a leading
// `!` to negate, a leading `./`. Extended globs (`@(…)`, `+(…)`, …), POSIX classes and `(a|b)` groups are
// refused by globSyntaxError.
//
// A list of globs: a path is in when one of its globs matches it and none of its `!` globs does, whatever their
// order (GitHub Actions' `paths` read the same when their `!` globs come last, as they are mostly written); a
// list of only `!` globs takes in every path none of them matches.

/** At most this many globs one glob's braces expand to. */
export const MAX_BRACE_EXPANSION = 64;
/** The most characters an automation's file_change globs may come to, braces expanded: a file event's matching costs at most that times the path's length. */
export const MAX_GLOB_CHARS = 8192;

type Token =
  { kind: 'char'; ch: string } | { kind: 'one' } | { kind: 'star' } | { kind: 'class'; negated: boolean; chars: string[]; ranges: [string, string][] };
type Segment = Token[] | 'globstar';

/** Each `{` of a glob with its closing `}` and the commas at its own depth, in one pass (an unclosed `{` is literal). */
function bracesOf(glob: string): Map<number, { close: number; commas: number[] }> {
  const found = new Map<number, { close: number; commas: number[] }>();
  const open: { at: number; commas: number[] }[] = [];
  for (let i = 0; i < glob.length; i++) {
    const c = glob[i];
    if (c === '\\') i++;
    else if (c === '{') open.push({ at: i, commas: [] });
    else if (c === ',' && open.length) open.at(-1)!.commas.push(i);
    else if (c === '}' && open.length) {
      const o = open.pop()!;
      found.set(o.at, { close: i, commas: o.commas });
    }
  }
  return found;
}

/** Expands a glob's braces: `a{b,c}` is `ab` and `ac`, `f{1..3}` is `f1`, `f2`, `f3`; throws past MAX_BRACE_EXPANSION. */
export function expandBraces(glob: string, out: string[] = []): string[] {
  const braces = bracesOf(glob);
  // the first brace that expands: one with commas, or a range (`{x}` is literal, a brace within it may expand)
  for (const [at, { close, commas }] of [...braces].sort((x, y) => x[0] - y[0])) {
    let parts: string[] | undefined;
    if (commas.length) {
      const bounds = [at, ...commas, close];
      parts = bounds.slice(1).map((b, k) => glob.slice(bounds[k]! + 1, b));
    } else parts = rangeOf(glob.slice(at + 1, close));
    if (!parts) continue;
    const head = glob.slice(0, at);
    const tail = glob.slice(close + 1);
    for (const part of parts) expandBraces(head + part + tail, out);
    return out;
  }
  return push(out, glob);
}

function push(out: string[], glob: string): string[] {
  out.push(glob);
  if (out.length > MAX_BRACE_EXPANSION) throw new Error(`its braces make more than ${MAX_BRACE_EXPANSION} globs`);
  return out;
}

function rangeOf(body: string): string[] | undefined {
  const numbers = /^(-?\d+)\.\.(-?\d+)$/.exec(body);
  const letters = /^([A-Za-z])\.\.([A-Za-z])$/.exec(body);
  if (!numbers && !letters) return undefined;
  const [from, to] = numbers ? [Number(numbers[1]), Number(numbers[2])] : [letters![1]!.charCodeAt(0), letters![2]!.charCodeAt(0)];
  if (Math.abs(to - from) + 1 > MAX_BRACE_EXPANSION) throw new Error(`its braces make more than ${MAX_BRACE_EXPANSION} globs`);
  const step = from <= to ? 1 : -1;
  const out: string[] = [];
  for (let n = from; n !== to + step; n += step) out.push(numbers ? String(n) : String.fromCharCode(n));
  return out;
}

/** One segment's tokens: `*` runs are one star; `[` without its `]` is a character. */
function tokensOf(segment: string): Token[] {
  const chars = Array.from(segment);
  const tokens: Token[] = [];
  for (let i = 0; i < chars.length; i++) {
    const c = chars[i]!;
    if (c === '\\' && i + 1 < chars.length) tokens.push({ kind: 'char', ch: chars[++i]! });
    else if (c === '*') {
      if (tokens.at(-1)?.kind !== 'star') tokens.push({ kind: 'star' });
    } else if (c === '?') tokens.push({ kind: 'one' });
    else if (c === '[') {
      const end = chars.indexOf(']', i + 2); // `[]a]`: a `]` first is a member
      if (end < 0) {
        tokens.push({ kind: 'char', ch: c });
        continue;
      }
      let body = chars.slice(i + 1, end);
      const negated = body[0] === '!' || body[0] === '^';
      if (negated) body = body.slice(1);
      const cls: Token = { kind: 'class', negated, chars: [], ranges: [] };
      for (let k = 0; k < body.length; k++) {
        if (body[k] === '\\' && k + 1 < body.length) k++;
        if (body[k + 1] === '-' && k + 2 < body.length) {
          cls.ranges.push([body[k]!, body[k + 2]!]);
          k += 2;
        } else cls.chars.push(body[k]!);
      }
      tokens.push(cls);
      i = end;
    } else tokens.push({ kind: 'char', ch: c });
  }
  return tokens;
}

/**
 * The names a glob's segments stand for, one a segment: a segment of no wildcard is the one name it matches
 * (escapes undone), any other is null. For a glob without braces (expandBraces first).
 */
export function literalSegmentsOf(glob: string): (string | null)[] {
  return segmentsOf(glob).map((s) => (s !== 'globstar' && s.every((t) => t.kind === 'char') ? s.map((t) => (t as { ch: string }).ch).join('') : null));
}

function segmentsOf(glob: string): Segment[] {
  while (glob.startsWith('./')) glob = glob.slice(2);
  const segments: Segment[] = glob.split('/').map((s) => (s === '**' ? 'globstar' : tokensOf(s)));
  // `a/**/**/b` is `a/**/b`
  return segments.filter((s, i) => !(s === 'globstar' && segments[i - 1] === 'globstar'));
}

function matchesOne(t: Token, c: string): boolean {
  switch (t.kind) {
    case 'char':
      return t.ch === c;
    case 'one':
      return true;
    case 'class': {
      const inside = t.chars.includes(c) || t.ranges.some(([lo, hi]) => c >= lo && c <= hi);
      return inside !== t.negated;
    }
    default:
      return false;
  }
}

const isDots = (name: string[]) => name[0] === '.' && (name.length === 1 || (name.length === 2 && name[1] === '.'));

/** A segment against its tokens: the wildcard walk that goes back only to the last star, O(tokens × characters). */
function segmentMatches(tokens: Token[], name: string[]): boolean {
  // `.` and `..` are matched only by a segment that starts with a dot (as picomatch: no wildcard takes them)
  if (isDots(name) && !(tokens[0]?.kind === 'char' && tokens[0].ch === '.')) return false;
  let ti = 0;
  let ni = 0;
  let starTi = -1;
  let starNi = 0;
  while (ni < name.length) {
    const t = tokens[ti];
    if (t && t.kind === 'star') {
      starTi = ti++;
      starNi = ni;
    } else if (t && matchesOne(t, name[ni]!)) {
      ti++;
      ni++;
    } else if (starTi >= 0) {
      ti = starTi + 1;
      ni = ++starNi;
    } else return false;
  }
  while (tokens[ti]?.kind === 'star') ti++;
  return ti === tokens.length;
}

/** The path's segments against the glob's, `**` taking any number of them: O(glob segments × path segments) segment matches. */
function pathMatches(segments: Segment[], names: string[][]): boolean {
  const P = segments.length;
  const S = names.length;
  // after[j]: the glob's segments from i on match the path's from j on (filled from the last segment back)
  let after: boolean[] = Array.from({ length: S + 1 }, (_, j) => j === S);
  for (let i = P - 1; i >= 0; i--) {
    const seg = segments[i]!;
    const here: boolean[] = new Array<boolean>(S + 1).fill(false);
    for (let j = S; j >= 0; j--) {
      if (seg === 'globstar') here[j] = after[j]! || (j < S && !isDots(names[j]!) && here[j + 1]!);
      else here[j] = j < S && after[j + 1]! && segmentMatches(seg, names[j]!);
    }
    after = here;
  }
  return after[0]!;
}

/** `(…|…)`, found in one pass (a regular expression for it backtracks on `(|(|(|…`). */
function hasGroup(glob: string): boolean {
  let open = false;
  let bar = false;
  for (const c of glob) {
    if (c === '(') [open, bar] = [true, false];
    else if (c === '|' && open) bar = true;
    else if (c === ')' && open) {
      if (bar) return true;
      open = false;
    }
  }
  return false;
}

/**
 * What in a glob this matcher does not take, or null. The parts of picomatch's syntax that are regular
 * expressions are refused rather than read some other way.
 */
export function globSyntaxError(glob: string): string | null {
  if (/[@!+*?]\(/.test(glob)) return 'extended globs such as @(a|b), !(a), +(a), *(a), ?(a) are not supported: use braces, {a,b}';
  if (/\[\[?:[a-z]+:\]/.test(glob)) return 'POSIX character classes such as [[:alpha:]] are not supported: name the characters, [a-zA-Z]';
  if (hasGroup(glob)) return 'groups such as (a|b) are not supported: use braces, {a,b}';
  try {
    expandBraces(glob);
  } catch (err) {
    return (err as Error).message;
  }
  return null;
}

/**
 * A matcher of paths relative to a root (`/`-separated) that answers whether the list of globs takes the
 * path in: one glob matches it, as picomatch(glob, { dot: true }) does for the syntax above, and no `!` glob
 * does (a list of only `!` globs: no `!` glob does). A `!` glob is an exclusion, never a match of its own: OR'd
 * in as "whatever it does not match", `['src/**', '!src/gen/**']` took in README.md and src/gen/x.ts. A glob
 * globSyntaxError refuses is not rejected here (an automation stored before): its parentheses are characters
 * and its braces past the bound are literal.
 */
export function compileGlobs(globs: string[]): (relPath: string) => boolean {
  const compiled = globs.map((glob) => {
    // `!{a,b}` is neither a nor b
    const negated = glob.startsWith('!');
    const body = negated ? glob.slice(1) : glob;
    let expanded: string[];
    try {
      expanded = expandBraces(body);
    } catch {
      expanded = [body];
    }
    return { negated, alternatives: expanded.map(segmentsOf) };
  });
  const included = compiled.filter((g) => !g.negated);
  const excluded = compiled.filter((g) => g.negated);
  return (relPath) => {
    const names = relPath.split('/').map((s) => Array.from(s));
    const hits = (g: (typeof compiled)[number]) => g.alternatives.some((segments) => pathMatches(segments, names));
    if (excluded.some(hits)) return false;
    return included.length ? included.some(hits) : excluded.length > 0;
  };
}

/** The characters globs come to with their braces expanded (what matching a path against them all costs, per character of the path). */
export function expandedChars(globs: string[]): number {
  return globs.reduce((n, glob) => n + expandBraces(glob).reduce((m, one) => m + one.length, 0), 0);
}
