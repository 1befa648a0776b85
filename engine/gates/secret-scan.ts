// The built-in secret scan: secretlint's recommended rules over the gate's input files, in the
// service's process (it reads; it runs nothing of the workspace). What it finds is masked before it
// becomes an annotation, so a found secret never reaches a result, the ledger or a log.
import fs from 'node:fs/promises';
import path from 'node:path';
import { lintSource } from '@secretlint/core';
import { creator as recommended } from '@secretlint/secretlint-rule-preset-recommend';
import type { Annotation } from './reports.js';

const MAX_FILE_BYTES = 1024 * 1024;
const CONFIG = { rules: [{ id: '@secretlint/secretlint-rule-preset-recommend', rule: recommended }] };

export async function scanSecrets(workspace: string, files: string[]): Promise<{ annotations: Annotation[]; scanned: number }> {
  const annotations: Annotation[] = [];
  let scanned = 0;
  for (const rel of files) {
    const file = path.join(workspace, rel);
    const stat = await fs.lstat(file).catch(() => null);
    if (!stat?.isFile() || stat.size > MAX_FILE_BYTES) continue;
    const content = await fs.readFile(file).catch(() => null);
    if (!content || content.subarray(0, 8192).includes(0)) continue; // binary
    scanned++;
    const result = await lintSource({
      source: { filePath: file, content: content.toString('utf8'), contentType: 'text' },
      options: { config: CONFIG, locale: 'en', maskSecrets: true },
    });
    for (const m of result.messages) {
      annotations.push({
        path: rel,
        line: m.loc.start.line,
        level: m.severity === 'error' ? 'failure' : 'warning',
        title: m.ruleId,
        message: m.message,
      });
    }
  }
  return { annotations, scanned };
}
