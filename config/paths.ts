// Where the files shipped with the service live, the same whether it runs from source (tsx) or dist/.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

function findRoot(from: string): string {
  let dir = from;
  while (!fs.existsSync(path.join(dir, 'package.json'))) {
    const up = path.dirname(dir);
    if (up === dir) throw new Error(`no package.json above ${from}`);
    dir = up;
  }
  return dir;
}

export const PROJECT_ROOT = findRoot(path.dirname(fileURLToPath(import.meta.url)));
export const OPENAPI_FILE = path.join(PROJECT_ROOT, 'api', 'openapi.yaml');
export const TEMPLATES_DIR = path.join(PROJECT_ROOT, 'templates');
export const GATES_SCHEMA_FILE = path.join(PROJECT_ROOT, 'config', 'gates.schema.json');

/**
 * Whether dist/ holds a build of the sources as they are: none of the TypeScript files the build compiles
 * (tsconfig.build.json's `include`) is newer than the record every build writes (dist/.tsbuildinfo). Running
 * from source (tsx), a child process can then start the built file instead of compiling the sources again.
 */
export function buildIsCurrent(root = PROJECT_ROOT): boolean {
  try {
    const builtAt = fs.statSync(path.join(root, 'dist', '.tsbuildinfo')).mtimeMs;
    const { include } = JSON.parse(fs.readFileSync(path.join(root, 'tsconfig.build.json'), 'utf8')) as { include: string[] };
    const newer = (p: string): boolean => {
      const st = fs.statSync(p);
      if (st.isDirectory()) return fs.readdirSync(p).some((name) => newer(path.join(p, name)));
      return p.endsWith('.ts') && st.mtimeMs > builtAt;
    };
    return !include.some((entry) => newer(path.join(root, entry)));
  } catch {
    // no build, or no sources to compare (an installed package runs from dist/ and never asks)
    return false;
  }
}
