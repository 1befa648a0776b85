// read_file, write_file, list_files: confined to the workspace. A path is resolved (symlinks
// included) before it is checked, so neither `..` nor a link can lead outside.
import fs from 'node:fs/promises';
import path from 'node:path';
import { stringArg, ToolError, type Tool } from './tool.js';

const READ_MAX_BYTES = 256 * 1024;
const LIST_MAX = 1000;

/** The real path of `rel` inside `root`, or a ToolError when it would leave it. */
export async function resolveInside(root: string, rel: string): Promise<string> {
  const realRoot = await fs.realpath(root);
  const target = path.resolve(realRoot, rel);
  // resolve the longest part that exists (following links), then add the parts still to be created
  const missing: string[] = [];
  let existing = target;
  for (;;) {
    let real: string;
    try {
      real = path.join(await fs.realpath(existing), ...missing);
    } catch (err) {
      const up = path.dirname(existing);
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT' || up === existing) throw err;
      missing.unshift(path.basename(existing));
      existing = up;
      continue;
    }
    if (real !== realRoot && !real.startsWith(realRoot + path.sep)) {
      throw new ToolError('path-outside-workspace', `${rel} resolves outside the workspace`);
    }
    return real;
  }
}

export const readFileTool: Tool = {
  name: 'read_file',
  description: 'Read a text file of the workspace (at most 256 KB).',
  parameters: { type: 'object', required: ['path'], properties: { path: { type: 'string', description: 'Relative to the workspace.' } } },
  async execute(args, ctx) {
    const file = await resolveInside(ctx.workspace, stringArg(args, 'path'));
    const handle = await fs.open(file, 'r').catch((err: NodeJS.ErrnoException) => {
      throw new ToolError(err.code === 'ENOENT' ? 'not-found' : 'io-error', `${args.path as string}: ${err.code}`);
    });
    try {
      const { size } = await handle.stat();
      const buf = Buffer.alloc(Math.min(size, READ_MAX_BYTES));
      await handle.read(buf, 0, buf.length, 0);
      return { output: { path: args.path, size, content: buf.toString('utf8'), truncated: size > READ_MAX_BYTES } };
    } finally {
      await handle.close();
    }
  },
};

export const writeFileTool: Tool = {
  name: 'write_file',
  description: 'Write a text file of the workspace, creating folders as needed.',
  parameters: {
    type: 'object',
    required: ['path', 'content'],
    properties: { path: { type: 'string' }, content: { type: 'string' } },
  },
  async execute(args, ctx) {
    const content = stringArg(args, 'content', false);
    const file = await resolveInside(ctx.workspace, stringArg(args, 'path'));
    await fs.mkdir(path.dirname(file), { recursive: true });
    // the folder may itself be a fresh link: check again once it exists
    await resolveInside(ctx.workspace, path.relative(await fs.realpath(ctx.workspace), file));
    await fs.writeFile(file, content, 'utf8');
    return { output: { path: args.path, bytes: Buffer.byteLength(content) } };
  },
};

export const listFilesTool: Tool = {
  name: 'list_files',
  description: 'List the files under a folder of the workspace (recursively, at most 1000).',
  parameters: { type: 'object', properties: { path: { type: 'string', description: 'Folder relative to the workspace; default the workspace itself.' } } },
  async execute(args, ctx) {
    const rel = typeof args.path === 'string' && args.path ? args.path : '.';
    const dir = await resolveInside(ctx.workspace, rel);
    const root = await fs.realpath(ctx.workspace);
    const files: string[] = [];
    const walk = async (d: string): Promise<void> => {
      for (const entry of await fs.readdir(d, { withFileTypes: true })) {
        if (files.length >= LIST_MAX) return;
        if (entry.name === '.git' || entry.name === 'node_modules' || entry.name === '.scratch') continue;
        const full = path.join(d, entry.name);
        if (entry.isDirectory()) await walk(full);
        else files.push(path.relative(root, full));
      }
    };
    await walk(dir);
    return { output: { path: rel, files: files.sort(), truncated: files.length >= LIST_MAX } };
  },
};
