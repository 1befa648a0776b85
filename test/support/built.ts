// The service and its command-line tool as they ship (dist/: what the Procfile and `npx automation-service`
// run): child processes start them without compiling TypeScript, which on two busy cores cost seconds of
// CPU a process.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { buildIsCurrent, PROJECT_ROOT } from '../../config/paths.js';

export const CLI = path.join(PROJECT_ROOT, 'dist', 'cli', 'main.js');
let checked = false;

/**
 * The built file of a source entry point (`workers/main.ts`: dist/workers/main.js). dist/ is checked
 * against the sources once a test process: `npm test` builds it first (pretest); a single file's run
 * after an edit builds it here, rather than test what the edit left behind.
 */
export function builtEntry(entry: string): string {
  if (!checked) {
    if (!buildIsCurrent()) {
      if (spawnSync(process.execPath, ['scripts/ensure-build.mjs'], { cwd: PROJECT_ROOT, stdio: 'inherit' }).status !== 0)
        throw new Error('dist/ could not be built (scripts/ensure-build.mjs)');
      // tsc leaves its build info as it was when no output changed (a file saved again as it was): dated
      // now, the next test process finds dist/ current instead of building again
      const now = new Date();
      fs.utimesSync(path.join(PROJECT_ROOT, 'dist', '.tsbuildinfo'), now, now);
    }
    checked = true;
  }
  return path.join(PROJECT_ROOT, 'dist', entry.replace(/\.ts$/, '.js'));
}

/** The built command-line tool's path. */
export const builtCli = () => builtEntry('cli/main.ts');
