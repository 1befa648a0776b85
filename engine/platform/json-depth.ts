// What a JSON text holds, read from its bytes before it is parsed. JSON.parse takes any depth, but
// what the service then does with the value does not: JSON.stringify recurses (a body nested 5,000 deep
// overflows the stack when it is stored), and SQLite's JSON functions stop at 1,000. Input deeper than
// MAX_JSON_DEPTH is refused where it comes in. How many values it holds, and how long its lists are, bound
// what parsing and checking it costs: a body of 100 KB is 50,000 values, and a schema validator that lists
// every error of a list's items does work that grows with the square of their number.
import { isUtf8 } from 'node:buffer';

/** The deepest nesting of objects and arrays a request or delivery body may have. */
export const MAX_JSON_DEPTH = 64;

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_OBJECT = 0x7b;
const OPEN_ARRAY = 0x5b;
const CLOSE_OBJECT = 0x7d;
const CLOSE_ARRAY = 0x5d;

const LOWER_U = 0x75;

/**
 * True when a string of the JSON text holds a lone surrogate (`\ud800` with no low half after it, or a low
 * half alone): JSON.parse takes it, and a stored name or body holding one is not well-formed Unicode, which
 * strict readers of the answers (jq, other languages' parsers) refuse, whole pages with it. Only escapes can
 * make one (UTF-8 cannot encode a surrogate).
 */
export function hasLoneSurrogate(text: Buffer): boolean {
  if (text.indexOf('\\u') === -1) return false;
  const hex = (at: number) => parseInt(text.toString('latin1', at, at + 4), 16);
  let inString = false;
  let pendingHigh = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (!inString) {
      if (c === QUOTE) inString = true;
      continue;
    }
    if (c === BACKSLASH && text[i + 1] === LOWER_U) {
      const unit = hex(i + 2);
      i += 5;
      const high = unit >= 0xd800 && unit <= 0xdbff;
      const low = unit >= 0xdc00 && unit <= 0xdfff;
      if (pendingHigh && !low) return true;
      if (low && !pendingHigh) return true;
      pendingHigh = high;
      continue;
    }
    if (pendingHigh) return true;
    if (c === BACKSLASH) i++;
    else if (c === QUOTE) inString = false;
  }
  return pendingHigh;
}

const MINUS = 0x2d;
const DIGIT_0 = 0x30;
const DIGIT_9 = 0x39;
const LOWER_E = 0x65;
const UPPER_E = 0x45;
const DOT = 0x2e;
const PLUS = 0x2b;
const isDigit = (c: number | undefined) => c !== undefined && c >= DIGIT_0 && c <= DIGIT_9;

/**
 * Reads the number that starts at `start` (a `-` or a digit outside a string): where it ends, and whether it is
 * too large for a double (`1e309`, `-1e400`, 309 digits). JSON.parse makes such a number ±Infinity, which is
 * stored as null (what was stored is not what was sent), and which the canonical form of a request (its
 * idempotency fingerprint) cannot hold. Its size is told from its digits and exponent as they are read; only one
 * whose power of ten is 308 or more is read as a number, to be sure. A malformed number (`1e`) does not
 * overflow: the parser refuses it as such.
 */
function readNumber(text: Uint8Array, start: number): { end: number; overflows: boolean } {
  let i = start;
  if (text[i] === MINUS) i++;
  // the power of ten of its first significant digit: the integer's digits after its leading zeros, or the
  // fraction's zeros before its first other digit
  let power = -1;
  let significant = false;
  for (; isDigit(text[i]); i++) {
    if (significant) power++;
    else if (text[i] !== DIGIT_0) {
      significant = true;
      power = 0;
    }
  }
  if (text[i] === DOT)
    for (i++; isDigit(text[i]); i++) {
      if (significant) continue;
      if (text[i] !== DIGIT_0) significant = true;
      else power--;
    }
  let exponent = 0;
  if (text[i] === LOWER_E || text[i] === UPPER_E) {
    i++;
    const negative = text[i] === MINUS;
    if (negative || text[i] === PLUS) i++;
    // held below a bound that keeps the sum exact: an exponent that large is past any double's either way
    for (; isDigit(text[i]); i++) exponent = Math.min(exponent * 10 + (text[i]! - DIGIT_0), 1e6);
    if (negative) exponent = -exponent;
  }
  const overflows =
    significant && power + exponent >= 308 && Math.abs(Number(Buffer.from(text.buffer, text.byteOffset + start, i - start).toString('latin1'))) === Infinity;
  return { end: i, overflows };
}

/**
 * The value with every string in it (and every key) made well-formed Unicode, a lone surrogate replaced by
 * U+FFFD: for JSON the service did not check as a body (a model's answer, a tool call's arguments), which it
 * stores and serves as it stores what it checked. What holds no lone surrogate is given back as it is, not copied.
 */
export function wellFormed<T>(value: T): T {
  if (typeof value === 'string') return (value.isWellFormed() ? value : value.toWellFormed()) as T;
  if (!value || typeof value !== 'object') return value;
  if (Array.isArray(value)) {
    const items = value.map(wellFormed);
    return (items.some((v, i) => v !== value[i]) ? items : value) as T;
  }
  const entries = Object.entries(value);
  const made = entries.map(([k, v]) => [wellFormed(k), wellFormed(v)] as const);
  return (made.some(([k, v], i) => k !== entries[i]![0] || v !== entries[i]![1]) ? Object.fromEntries(made) : value) as T;
}

/** The most values a JSON body may hold: a real one holds hundreds or a few thousand; 2 million tiny ones parsed for 3 s. */
export const MAX_JSON_VALUES = 50_000;

/**
 * Why a JSON text is refused before it is parsed (not UTF-8, too deep, a lone surrogate, or a number past a
 * double's range), or null when it
 * is not: one check for the API's bodies and every webhook intake, all of which store what they take (bytes
 * that are not UTF-8 were decoded as U+FFFD: a shell command stored was not the one sent, a delivery's body
 * not the bytes its size and hash are of). `detail` names `what` was refused; `rule` is the rule it broke.
 */
export function unsafeJson(text: Buffer, what = 'the body'): { detail: string; rule: string } | null {
  if (!isUtf8(text)) return { detail: `${what} is not UTF-8, which JSON is (RFC 8259)`, rule: 'must be UTF-8' };
  // its depth and its numbers in one pass over the bytes
  const over = overLimit(text, { depth: MAX_JSON_DEPTH, numbers: true });
  if (over === 'depth')
    return { detail: `${what} nests deeper than ${MAX_JSON_DEPTH} levels`, rule: `must not nest objects and arrays deeper than ${MAX_JSON_DEPTH} levels` };
  if (hasLoneSurrogate(text))
    return { detail: `${what} holds a lone surrogate (a \\ud800-\\udfff escape without its other half)`, rule: 'strings must be well-formed Unicode' };
  if (over === 'number') return { detail: `${what} holds a number too large for a double (beyond ±1.8e308)`, rule: 'numbers must be finite doubles' };
  return null;
}

const COMMA = 0x2c;

/**
 * The first of its limits the JSON text passes, or null: how deep objects and arrays nest, how many values it
 * holds (objects, arrays and what commas separate), how many items one list holds; with `numbers`, whether a
 * number is too large for a double (`number`, told only when no other limit is passed). Brackets, commas and
 * digits inside strings do not count. One pass over the bytes.
 */
function overLimit(
  text: Uint8Array,
  limits: { depth?: number; values?: number; items?: number; numbers?: boolean },
): 'depth' | 'values' | 'items' | 'number' | null {
  const { depth = Infinity, values: valuesMax = Infinity, items = Infinity, numbers = false } = limits;
  let overflows = false;
  let values = 0;
  // per open container: the commas seen at its level, or -1 for an object (its members are not counted)
  const commas: number[] = [];
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (inString) {
      if (c === BACKSLASH) i++;
      else if (c === QUOTE) inString = false;
    } else if (c === QUOTE) inString = true;
    else if (c === OPEN_ARRAY || c === OPEN_OBJECT) {
      if (++values > valuesMax) return 'values';
      if (commas.push(c === OPEN_ARRAY ? 0 : -1) > depth) return 'depth';
    } else if (c === CLOSE_ARRAY || c === CLOSE_OBJECT) commas.pop();
    else if (c === COMMA) {
      if (++values > valuesMax) return 'values';
      const top = commas.length - 1;
      const seen = top < 0 ? -1 : commas[top]!;
      if (seen >= 0 && (commas[top] = seen + 1) >= items) return 'items';
    } else if (numbers && (c === MINUS || isDigit(c))) {
      const number = readNumber(text, i);
      overflows ||= number.overflows;
      i = number.end - 1; // the loop's own step reads the byte after the number
    }
  }
  return overflows ? 'number' : null;
}

/**
 * Why a JSON text holds too much to be checked value by value (more than `limits.values` values, or a list
 * of more than `limits.items` items), or null when it does not. `detail` names `what` was refused; `rule`
 * is the rule it broke.
 */
export function bulkyJson(text: Uint8Array, limits: { values: number; items: number }, what = 'the body'): { detail: string; rule: string } | null {
  const over = overLimit(text, limits);
  if (over === 'values')
    return { detail: `${what} holds more than ${limits.values} JSON values`, rule: `must not hold more than ${limits.values} JSON values` };
  if (over === 'items')
    return { detail: `${what} holds a list of more than ${limits.items} items`, rule: `must not hold a list of more than ${limits.items} items` };
  return null;
}
