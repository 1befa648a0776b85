// The http tool against a local server: what it keeps of a long body, and that it stops reading one that never ends.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { expect } from 'chai';
import { httpTool } from '../../engine/tools/http.js';
import type { ToolContext } from '../../engine/tools/tool.js';

describe('http tool', () => {
  let server: http.Server;
  let url: string;
  let endless: http.ServerResponse | null = null;
  before(async () => {
    server = http.createServer((req, res) => {
      res.writeHead(200, { 'content-type': 'text/plain; charset=utf-8' });
      if (req.url === '/long')
        res.end(`START${'é'.repeat(200_000)}END`); // about 400 KB
      else {
        // a body that never ends, a chunk every few ms
        endless = res;
        const more = () => res.write('x'.repeat(64 * 1024), () => setTimeout(more, 5));
        more();
      }
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  after(async () => {
    endless?.destroy();
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  const ctx = { httpAllowPrivate: true, signal: new AbortController().signal } as unknown as ToolContext;

  it('keeps the start of a body over 256 KB, cut at a whole character, and says it was cut', async () => {
    const { output } = await httpTool.execute({ url: `${url}/long` }, ctx);
    const body = (output as { body: string }).body;
    expect(body.startsWith('START')).to.equal(true);
    expect(body).not.to.contain('END').and.not.to.contain('\uFFFD');
    expect(Buffer.byteLength(body)).to.be.within(256 * 1024 - 1, 256 * 1024);
    expect((output as { truncated: boolean }).truncated).to.equal(true);
  });

  it('stops reading a body that never ends once it has kept 256 KB', async () => {
    const started = Date.now();
    const { output } = await httpTool.execute({ url: `${url}/endless` }, ctx);
    expect((output as { truncated: boolean }).truncated).to.equal(true);
    expect(Date.now() - started).to.be.below(5000);
  });
});
