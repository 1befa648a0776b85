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
