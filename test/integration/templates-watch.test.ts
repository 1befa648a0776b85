import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { expect } from 'chai';
import { TEMPLATES_DIR } from '../../config/paths.js';
import { createLogger } from '../../engine/platform/log.js';
import { createTemplateCatalog, type TemplateCatalog } from '../../engine/automations/templates.js';

async function eventually(check: () => boolean, what: string, ms = 5000): Promise<void> {
  const until = Date.now() + ms;
  while (!check()) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

describe('template catalog', () => {
  it('ships exactly the 8 built-in templates, each with described variables', async () => {
    const catalog = createTemplateCatalog({ dir: TEMPLATES_DIR, log: createLogger('silent') });
    await catalog.load();
    const ids = catalog.list().map((t) => t.id);
    expect(ids).to.have.length(8);
    expect(new Set(ids).size).to.equal(8);
    for (const t of catalog.list()) {
      expect(t.variables.length, t.id).to.be.greaterThan(0);
      for (const v of t.variables) expect(v.description, `${t.id}.${v.name}`).to.be.a('string').that.is.not.empty;
    }
  });

  describe('watching a folder', () => {
    let dir: string;
    let catalog: TemplateCatalog;
    let logs: string[];
    beforeEach(async () => {
      dir = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-templates-'));
      await fs.copyFile(path.join(TEMPLATES_DIR, 'pr-review.yaml'), path.join(dir, 'pr-review.yaml'));
      logs = [];
      const sink = new Writable({ write: (c, _e, done) => (logs.push(String(c)), done()) });
      catalog = createTemplateCatalog({ dir, log: createLogger('info', sink) });
      await catalog.load();
      await catalog.watch();
    });
    afterEach(async () => {
      await catalog.close();
      await fs.rm(dir, { recursive: true, force: true });
    });

    it('picks up a changed file without a restart', async () => {
      const file = path.join(dir, 'pr-review.yaml');
      const text = await fs.readFile(file, 'utf8');
      await fs.writeFile(file, text.replace('name: Review a pull request when it opens', 'name: Review every pull request'));
      await eventually(() => catalog.get('pr-review')?.name === 'Review every pull request', 'the new name');
    });

    it('adds a new file and drops a removed one', async () => {
      await fs.copyFile(path.join(TEMPLATES_DIR, 'nightly-audit.yaml'), path.join(dir, 'nightly-audit.yaml'));
      await eventually(() => catalog.get('nightly-audit') !== undefined, 'the added template');
      await fs.rm(path.join(dir, 'nightly-audit.yaml'));
      await eventually(() => catalog.get('nightly-audit') === undefined, 'the removed template');
    });

    it('logs a broken file and keeps the last good version', async () => {
      const before = catalog.get('pr-review');
      await fs.writeFile(path.join(dir, 'pr-review.yaml'), 'id: pr-review\nname: [unclosed\n');
      await eventually(() => logs.some((l) => l.includes('template file is broken')), 'the error line');
      expect(catalog.get('pr-review')).to.deep.equal(before);
      expect(logs.find((l) => l.includes('template file is broken'))).to.contain('the last good version stays');
    });
  });
});
