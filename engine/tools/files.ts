// read_file, write_file, list_files: confined to the workspace. The service runs them itself, outside
// the sandbox: what a path opens is checked to be inside the workspace after it is opened (a link put
// on the path meanwhile leads nowhere), only plain files are read or written, and nothing blocks (a
// FIFO is refused, not waited on). See engine/platform/inside.ts.
import fs from 'node:fs/promises';
import type { FileHandle } from 'node:fs/promises';
import path from 'node:path';
import { entriesOf, openChildFolder, openInside, openToWriteInside, OutsideError } from '../platform/index.js';
import { stringArg, ToolError, type Tool } from './tool.js';

const READ_MAX_BYTES = 256 * 1024;
const LIST_MAX = 1000;
/** `list_files` walks at most this many folders: a tree of empty folders, which no size limit bounds, ends its walk too. */
const LIST_MAX_FOLDERS = 10_000;

/** The real path of `rel` inside `root`, or a ToolError when it would leave it (a check at a run's creation: the tools check what they open). */
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

/** The tool's error for what opening a workspace path threw. */
function refusal(rel: string, err: unknown): ToolError {
  if (err instanceof ToolError) return err;
  if (err instanceof OutsideError) return new ToolError('path-outside-workspace', `${rel} resolves outside the workspace`);
  const code = (err as NodeJS.ErrnoException).code;
  if (code === 'ENOENT') return new ToolError('not-found', `${rel}: ENOENT`);
  if (code === 'ELOOP') return new ToolError('invalid-args', `${rel} is a link: name the file it points to`);
  return new ToolError('io-error', `${rel}: ${code ?? (err as Error).message}`);
}

/** Refuses (closing it) what is not a plain file: a folder, a FIFO, a device. */
async function plainFile(handle: FileHandle, rel: string) {
  const stat = await handle.stat();
  if (stat.isFile()) return stat;
  await handle.close();
  throw new ToolError('invalid-args', `${rel} is not a plain file`);
}

export const readFileTool: Tool = {
  name: 'read_file',
  description: 'Read a text file of the workspace (at most 256 KB).',
  parameters: { type: 'object', required: ['path'], properties: { path: { type: 'string', description: 'Relative to the workspace.' } } },
  async execute(args, ctx) {
    const rel = stringArg(args, 'path');
    const handle = await openInside(ctx.workspace, rel).catch((err: unknown) => {
      throw refusal(rel, err);
    });
    const { size } = await plainFile(handle, rel);
    try {
      const buf = Buffer.alloc(Math.min(size, READ_MAX_BYTES));
      const { bytesRead } = await handle.read(buf, 0, buf.length, 0);
      return { output: { path: args.path, size, content: buf.subarray(0, bytesRead).toString('utf8'), truncated: size > READ_MAX_BYTES } };
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
    const rel = stringArg(args, 'path');
    const handle = await openToWriteInside(ctx.workspace, rel).catch((err: unknown) => {
      throw refusal(rel, err);
    });
    await plainFile(handle, rel);
    try {
      await handle.truncate(0);
      await handle.writeFile(content, 'utf8');
    } finally {
      await handle.close();
    }
    return { output: { path: args.path, bytes: Buffer.byteLength(content) } };
  },
};

export const listFilesTool: Tool = {
  name: 'list_files',
  description: 'List the files under a folder of the workspace (recursively, at most 1000 files in at most 10,000 folders; truncated says some were left out).',
  parameters: { type: 'object', properties: { path: { type: 'string', description: 'Folder relative to the workspace; default the workspace itself.' } } },
  async execute(args, ctx) {
    const rel = typeof args.path === 'string' && args.path ? args.path : '.';
    const top = await openInside(ctx.workspace, rel, { folder: true }).catch((err: unknown) => {
      throw refusal(rel, err);
    });
    // names relative to the workspace, as the path asked for reads them
    const base = path.relative(ctx.workspace, path.resolve(ctx.workspace, rel));
    const files: string[] = [];
    // set once an entry is left out (a file past the thousandth, a folder past LIST_MAX_FOLDERS): the walk stops there
    let truncated = false;
    let folders = 0;
    // each folder is opened from its open parent, a link never followed: what is listed stays inside
    const walk = async (folder: FileHandle, at: string): Promise<void> => {
      for (const entry of await entriesOf(folder)) {
        if (truncated) return;
        if (entry.name === '.git' || entry.name === 'node_modules' || entry.name === '.scratch') continue;
        const name = path.join(at, entry.name);
        if (!entry.isDirectory()) {
          if (files.length === LIST_MAX) truncated = true;
          else files.push(name);
          continue;
        }
        if (++folders > LIST_MAX_FOLDERS) {
          truncated = true;
          return;
        }
        const child = await openChildFolder(folder, entry.name).catch(() => null); // gone, or swapped for a link
        if (!child) continue;
        try {
          await walk(child, name);
        } finally {
          await child.close();
        }
      }
    };
    try {
      await walk(top, base);
    } finally {
      await top.close();
    }
    return { output: { path: rel, files: files.sort(), truncated } };
  },
};
