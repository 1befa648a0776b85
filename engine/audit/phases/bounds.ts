// How much of the workspace a phase's result may quote: every phase's findings and metrics pass through
// here (phase-main) before they are printed, so a report stays a few MB whatever the workspace holds. A
// lockfile of 1,000 packages whose licenses were 25,000 characters each made a 50 MB report (126 MB in Redis
// with its stream), and serving it made Redis's one shared connection answer other tenants 503.

/** A finding's message, in UTF-8 bytes of its JSON (a 1,000-finding phase stays under 2 MB with its files). */
export const MESSAGE_MAX_BYTES = 1024;
/** A finding's file, and any text of the metrics. */
export const TEXT_MAX_BYTES = 512;
/** A key of the metrics (a license's name): a map's keys are as many as its entries, each at this most. */
export const KEY_MAX_BYTES = 200;
/** The entries of a map (licenses by name) or a list the metrics keep; the rest go into `other`. */
export const ENTRIES_MAX = 100;
/**
 * The declared dependencies the health phase hands the service (which looks up 200 at most), each name and locked
 * version at NAME_MAX_BYTES (over npm's 214 characters: a valid name is never cut) and its range at TEXT_MAX_BYTES.
 */
export const DEPENDENCIES_MAX = 1000;
export const NAME_MAX_BYTES = 256;
/**
 * What a phase prints at most (run-phase's cap; past it the phase fails): 1,000 findings at about 1.7 KB each, and
 * the health phase's 1,000 dependencies at about 1.1 KB each, fit with room for the metrics.
 */
export const PHASE_OUTPUT_MAX_BYTES = 4 * 1024 * 1024;

/**
 * What one UTF-16 unit costs in the JSON the phase prints, in UTF-8 bytes: escapes (a control character is
 * `\u001f`, six) and multi-byte characters count as they will be written, not as one character each.
 */
function unitBytes(text: string, i: number): [bytes: number, units: number] {
  const c = text.charCodeAt(i);
  if (c < 0x20) return [6, 1];
  if (c === 0x22 || c === 0x5c) return [2, 1];
  if (c < 0x80) return [1, 1];
  if (c < 0x800) return [2, 1];
  if (c >= 0xd800 && c <= 0xdbff) {
    const next = text.charCodeAt(i + 1);
    // a pair is one 4-byte character, never cut in two; a lone surrogate is written escaped
    return next >= 0xdc00 && next <= 0xdfff ? [4, 2] : [6, 1];
  }
  if (c >= 0xdc00 && c <= 0xdfff) return [6, 1];
  return [3, 1];
}

/**
 * The text at most `maxBytes` as JSON, and saying it was cut (how many characters were left out) when it was. The text
 * must be masked before it is cut: a secret cut in two is no longer one the mask recognises, and its first half
 * would be shown.
 */
export function cutText(text: string, maxBytes: number): string {
  let bytes = 0;
  let i = 0;
  while (i < text.length) {
    const [b, units] = unitBytes(text, i);
    if (bytes + b > maxBytes) break;
    bytes += b;
    i += units;
  }
  return i === text.length ? text : `${text.slice(0, i)}… (cut: ${text.length - i} more characters)`;
}

/**
 * The metrics within bounds: each text and key cut (keys that become equal are counted together), and a map of
 * more than ENTRIES_MAX entries kept at its largest ENTRIES_MAX when its values are counts, its first otherwise,
 * with `other` holding the rest's total (counts) or how many entries were left out. A list keeps its first
 * ENTRIES_MAX items. Phases make their metrics' shape; only their texts and keys come from the workspace.
 */
export function boundedMetrics(value: unknown): unknown {
  if (typeof value === 'string') return cutText(value, TEXT_MAX_BYTES);
  if (Array.isArray(value)) return value.slice(0, ENTRIES_MAX).map(boundedMetrics);
  if (!value || typeof value !== 'object') return value;
  const merged = new Map<string, unknown>();
  for (const [k, v] of Object.entries(value)) {
    const key = cutText(k, KEY_MAX_BYTES);
    const had = merged.get(key);
    if (had === undefined) merged.set(key, boundedMetrics(v));
    else if (typeof had === 'number' && typeof v === 'number') merged.set(key, had + v);
  }
  if (merged.size <= ENTRIES_MAX) return Object.fromEntries(merged);
  const entries = [...merged];
  const counts = entries.every(([, v]) => typeof v === 'number');
  if (counts) entries.sort((a, b) => (b[1] as number) - (a[1] as number));
  const kept = entries.filter(([k]) => k !== 'other').slice(0, ENTRIES_MAX);
  const keptKeys = new Set(kept.map(([k]) => k));
  const rest = entries.filter(([k]) => !keptKeys.has(k));
  return Object.fromEntries([...kept, ['other', counts ? rest.reduce((n, [, v]) => n + (v as number), 0) : rest.length]]);
}
