// The command-line tool as it ships (dist/cli/main.js, what `npx automation-service` runs): child
// processes start it without compiling TypeScript, which on two busy cores took seconds a call.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { PROJECT_ROOT } from '../../config/paths.js';

export const CLI = path.join(PROJECT_ROOT, 'dist', 'cli', 'main.js');

/** The built CLI's path; `npm test` builds dist/ first (pretest), a single-file run builds it here when it is missing. */
export function builtCli(): string {
  if (!fs.existsSync(CLI) && spawnSync(process.execPath, ['scripts/ensure-build.mjs'], { cwd: PROJECT_ROOT, stdio: 'inherit' }).status !== 0)
    throw new Error('dist/ could not be built (scripts/ensure-build.mjs)');
  return CLI;
}
