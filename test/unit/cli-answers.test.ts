// The CLI's calls (cli/client.ts, ApiClient.request) against stub servers: an answer is read up to 16 MB and
// no further, and what the server wrote in an error or a page that is not JSON reaches the terminal as
// escapes, never as sequences it would obey.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { expect } from 'chai';
import { ApiClient, ApiError, CliError } from '../../cli/client.js';

const CONTROL = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/;

describe('the CLI reading an answer', function () {
  this.timeout(20_000);
  let server: http.Server;
  afterEach(() => {
    server.closeAllConnections();
    server.close();
  });
  const stub = async (handler: http.RequestListener): Promise<string> => {
    server = http.createServer(handler);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  };
  const failure = (p: Promise<unknown>) =>
    p.then(
      () => null,
      (e: Error) => e,
    );

  it('refuses an answer past 16 MB with exit 5, announced or not, and stops reading it', async () => {
    for (const announced of [false, true]) {
      let sent = 0;
      let finished = false;
      const url = await stub((_req, res) => {
        // valid JSON of 400 MB unless the reader stops: read whole, it took the process to 1.7 GB
        const total = 400 * 1024 * 1024;
        res.writeHead(200, { 'content-type': 'application/json', ...(announced ? { 'content-length': String(total + 11) } : {}) });
        const chunk = 'x'.repeat(64 * 1024);
        res.write('{"data":"');
        const more = () => {
          while (sent < total && !res.destroyed) {
            sent += chunk.length;
            if (!res.write(chunk)) return void res.once('drain', more);
          }
          if (!res.destroyed) res.end('"}', () => (finished = true));
        };
        more();
      });
      const err = await failure(new ApiClient(url, 'k').request('GET', '/api/v1/runs'));
      expect(err, `announced: ${announced}`).to.be.instanceOf(CliError);
      expect((err as CliError).exitCode).to.equal(5);
      expect(err!.message).to.contain('the answer to GET /api/v1/runs is larger than 16 MB');
      expect(finished).to.equal(false);
      expect(sent).to.be.below(64 * 1024 * 1024);
      server.closeAllConnections();
      server.close();
    }
  });

  it('reads an answer up to the limit as before', async () => {
    const body = JSON.stringify({ data: 'x'.repeat(8 * 1024 * 1024) });
    const url = await stub((_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end(body));
    const page = await new ApiClient(url, 'k').request<{ data: string }>('GET', '/api/v1/runs');
    expect(page.data.length).to.equal(8 * 1024 * 1024);
  });

  it('shows the control characters of a problem (title, detail, code, errors) and of a 2xx that is not JSON as escapes', async () => {
    const evil = '\u001b]0;pwned\u0007\u001b[2J\u001b[1A\r\u009b31m';
    const problem = {
      title: `t${evil}`,
      detail: `d${evil}\nautomation-service: all good`,
      code: `c${evil}`,
      errors: [{ path: `/p${evil}`, message: `m${evil}` }],
    };
    let url = await stub((_req, res) => res.writeHead(400, { 'content-type': 'application/problem+json' }).end(JSON.stringify(problem)));
    const err = await failure(new ApiClient(url, 'k').request('GET', '/api/v1/runs'));
    expect(err).to.be.instanceOf(ApiError);
    expect(err!.message).not.to.match(CONTROL);
    expect(err!.message).to.contain('c\\u001b]0;pwned\\u0007\\u001b[2J').and.contain('d\\u001b').and.contain('\\u000aautomation-service: all good');
    // one line for the problem, one for each of its errors: the server's line breaks are escapes too
    const escaped = (text: string) => text.replace(/[\u0000-\u001f\u007f-\u009f]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
    expect(err!.message.split('\n')).to.deep.equal([
      `400 ${escaped(problem.code)}: ${escaped(problem.detail)}`,
      `  ${escaped(problem.errors[0]!.path)}: ${escaped(problem.errors[0]!.message)}`,
    ]);
    server.close();
    url = await stub((_req, res) => res.writeHead(200, { 'content-type': 'text/html' }).end(`<html>${evil}`));
    const page = await failure(new ApiClient(url, 'k').request('GET', '/api/v1/runs'));
    expect((page as CliError).exitCode).to.equal(5);
    expect(page!.message).to.contain('not JSON').and.contain('<html>\\u001b]0;pwned');
    expect(page!.message).not.to.match(CONTROL);
  });
});
