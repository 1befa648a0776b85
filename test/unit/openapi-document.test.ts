import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { parse } from 'yaml';
import { OPENAPI_JSON_FILE, openApiDocument, readOpenApiDocument } from '../../config/openapi-document.js';
import { OPENAPI_FILE } from '../../config/paths.js';

describe('the OpenAPI document at start', () => {
  let dir: string;
  beforeEach(async () => (dir = await fs.mkdtemp(path.join(os.tmpdir(), 'openapi-doc-'))));
  afterEach(() => fs.rm(dir, { recursive: true, force: true }));

  it('reads the built JSON only while it holds the YAML’s hash: an edited YAML is parsed again', async () => {
    const yaml = path.join(dir, 'openapi.yaml');
    const json = path.join(dir, 'openapi.json');
    const text = 'openapi: 3.1.0\ninfo: { title: from yaml, version: "1" }\n';
    await fs.writeFile(yaml, text);
    const sha256 = createHash('sha256').update(text).digest('hex');
    // the JSON says something else, so the test tells which file answered
    await fs.writeFile(json, JSON.stringify({ sha256, document: { openapi: '3.1.0', info: { title: 'from json' } } }));
    expect((readOpenApiDocument(yaml, json) as { info: { title: string } }).info.title).to.equal('from json');
    await fs.writeFile(yaml, text.replace('from yaml', 'edited'));
    expect((readOpenApiDocument(yaml, json) as { info: { title: string } }).info.title).to.equal('edited');
    await fs.writeFile(json, '{"sha256": "cut off');
    expect((readOpenApiDocument(yaml, json) as { info: { title: string } }).info.title).to.equal('edited');
    await fs.rm(json);
    expect((readOpenApiDocument(yaml, json) as { info: { title: string } }).info.title).to.equal('edited');
  });

  it('is the repository’s api/openapi.yaml, which the build wrote as JSON', async () => {
    const built = JSON.parse(await fs.readFile(OPENAPI_JSON_FILE, 'utf8')) as { sha256: string };
    const text = await fs.readFile(OPENAPI_FILE, 'utf8');
    expect(built.sha256, 'npm test builds first (scripts/ensure-build.mjs)').to.equal(createHash('sha256').update(text).digest('hex'));
    expect(openApiDocument()).to.deep.equal(parse(text));
  });
});
