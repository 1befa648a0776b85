// The list_files tool's bounds: at most 1000 files, `truncated` only when one was left out, and a walk that
// ends at 10,000 folders (a tree of empty folders costs its tenant nothing of its disk).
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { listFilesTool } from '../../engine/tools/files.js';
import type { ToolContext } from '../../engine/tools/index.js';

type Listing = { files: string[]; truncated: boolean };

describe('list_files bounds', function () {
  this.timeout(30_000);
  let ws: string;
  const list = async (rel = '.') => (await listFilesTool.execute({ path: rel }, { workspace: ws } as ToolContext)).output as Listing;
  const files = async (dir: string, n: number) => {
    await fs.mkdir(path.join(ws, dir), { recursive: true });
    await Promise.all(Array.from({ length: n }, (_, i) => fs.writeFile(path.join(ws, dir, `f${i}`), '')));
  };

  beforeEach(async () => {
    ws = await fs.realpath(await fs.mkdtemp(path.join(os.tmpdir(), 'list-files-')));
  });
  afterEach(() => fs.rm(ws, { recursive: true, force: true }));

  it('lists exactly 1000 files as whole, and 1001 as 1000 truncated', async () => {
    await files('whole', 1000);
    expect(await list('whole'))
      .to.deep.include({ truncated: false })
      .and.have.nested.property('files.length', 1000);
    await files('over/deep', 1);
    await files('over', 1000);
    const over = await list('over');
    expect(over.truncated).to.equal(true);
    expect(over.files).to.have.length(1000);
  });

  it('ends its walk at 10,000 folders, and says some were left out', async () => {
    for (let i = 0; i < 101; i++) await Promise.all(Array.from({ length: 100 }, (_, j) => fs.mkdir(path.join(ws, `d${i}`, `e${j}`), { recursive: true })));
    const answer = await list();
    expect(answer).to.deep.equal({ path: '.', files: [], truncated: true });
    // 99 folders of 100 each: 9,999 in all, read to the end
    for (const d of ['d100', 'd99']) await fs.rm(path.join(ws, d), { recursive: true });
    expect(await list()).to.deep.equal({ path: '.', files: [], truncated: false });
  });
});
