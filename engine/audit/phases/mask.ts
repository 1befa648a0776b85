// secretlint's recommended rules for the phases: the security phase's scan, and the masking of any
// text of the workspace a finding or an error quotes (a TODO's words, a script, a parse error).
import { secretLintProfiler } from '@secretlint/profiler';
import { lintSource } from '@secretlint/core';
import { creator as recommended } from '@secretlint/secretlint-rule-preset-recommend';

// secretlint 12's profiler records a performance mark per rule per file and scans every earlier one on
// each: O(n^2) in the files a process lints (5,000 files: 437 s instead of a few). Nothing reads it;
// upstream makes it opt-in in 13 (secretlint#1673), which needs Node 22. Until then its marks are dropped.
secretLintProfiler.mark = () => {};

export const SECRETLINT = { rules: [{ id: '@secretlint/secretlint-rule-preset-recommend', rule: recommended }] };

/** The text with what the recommended rules find replaced by `***`. */
export async function masked(text: string): Promise<string> {
  const result = await lintSource({
    source: { filePath: '/script.txt', content: text, contentType: 'text' },
    options: { config: SECRETLINT, locale: 'en', maskSecrets: true },
  });
  let out = text;
  for (const [start, end] of result.messages.map((m) => m.range).sort((a, b) => b[0] - a[0])) out = `${out.slice(0, start)}***${out.slice(end)}`;
  return out;
}
