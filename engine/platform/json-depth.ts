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

/** True when the JSON text nests objects and arrays deeper than `max` (brackets inside strings do not count). */
export function nestsDeeperThan(text: Uint8Array, max = MAX_JSON_DEPTH): boolean {
  return overLimit(text, { depth: max }) === 'depth';
}

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

/** The most values a JSON body may hold: a real one holds hundreds or a few thousand; 2 million tiny ones parsed for 3 s. */
export const MAX_JSON_VALUES = 50_000;

/**
 * Why a JSON text is refused before it is parsed (not UTF-8, too deep, or a lone surrogate), or null when it
 * is not: one check for the API's bodies and every webhook intake, all of which store what they take (bytes
 * that are not UTF-8 were decoded as U+FFFD: a shell command stored was not the one sent, a delivery's body
 * not the bytes its size and hash are of). `detail` names `what` was refused; `rule` is the rule it broke.
 */
export function unsafeJson(text: Buffer, what = 'the body'): { detail: string; rule: string } | null {
  if (!isUtf8(text)) return { detail: `${what} is not UTF-8, which JSON is (RFC 8259)`, rule: 'must be UTF-8' };
  if (nestsDeeperThan(text))
    return { detail: `${what} nests deeper than ${MAX_JSON_DEPTH} levels`, rule: `must not nest objects and arrays deeper than ${MAX_JSON_DEPTH} levels` };
  if (hasLoneSurrogate(text))
    return { detail: `${what} holds a lone surrogate (a \\ud800-\\udfff escape without its other half)`, rule: 'strings must be well-formed Unicode' };
  return null;
}

const COMMA = 0x2c;

/**
 * The first of its limits the JSON text passes, or null: how deep objects and arrays nest, how many values it
 * holds (objects, arrays and what commas separate), how many items one list holds. Brackets and commas inside
 * strings do not count. One pass over the bytes.
 */
function overLimit(text: Uint8Array, limits: { depth?: number; values?: number; items?: number }): 'depth' | 'values' | 'items' | null {
  const { depth = Infinity, values: valuesMax = Infinity, items = Infinity } = limits;
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
    }
  }
  return null;
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
