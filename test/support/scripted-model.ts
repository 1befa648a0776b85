// A local server that speaks the OpenAI chat-completions protocol and plays a scripted conversation:
// each request gets the next scripted answer. It records what it was sent. No model runs here.
import http from 'node:http';
import type { AddressInfo } from 'node:net';

export type ScriptedTurn =
  | {
      content?: string | null;
      /** `raw`: the arguments' text as sent, in place of `args` as JSON (a model's broken JSON) */
      tool_calls?: { name: string; args: Record<string, unknown>; raw?: string }[];
      /** the answer waits for this (a test acts while the agent is between turns) */
      gate?: Promise<unknown>;
      /** the answer comes this late */
      delay_ms?: number;
      /** the headers come at once, the body this late (an endpoint that stalls mid-answer) */
      stall_ms?: number;
    }
  | { status: number; headers?: Record<string, string> }
  /** this JSON as the whole answer, whatever its shape (an endpoint that does not keep to the protocol) */
  | { raw: unknown };

export type ScriptedModel = {
  url: string;
  requests: { headers: http.IncomingHttpHeaders; body: any; at: number }[];
  close(): Promise<void>;
};

export async function startScriptedModel(script: ScriptedTurn[]): Promise<ScriptedModel> {
  const requests: ScriptedModel['requests'] = [];
  let turn = 0;
  const server = http.createServer((req, res) => {
    let raw = '';
    req.on('data', (d) => (raw += d));
    req.on('end', async () => {
      if (req.method !== 'POST' || req.url !== '/v1/chat/completions') {
        res.writeHead(404).end();
        return;
      }
      const body = JSON.parse(raw);
      requests.push({ headers: req.headers, body, at: Date.now() });
      const index = ++turn;
      const next = script[Math.min(index - 1, script.length - 1)]!;
      if ('status' in next) {
        res.writeHead(next.status, { 'content-type': 'application/json', ...next.headers }).end('{"error":{"message":"scripted failure"}}');
        return;
      }
      if ('raw' in next) {
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(next.raw));
        return;
      }
      await next.gate;
      if (next.delay_ms) await new Promise((r) => setTimeout(r, next.delay_ms));
      if (res.destroyed) return;
      const message = {
        role: 'assistant',
        content: next.content ?? null,
        ...(next.tool_calls?.length
          ? {
              tool_calls: next.tool_calls.map((c, i) => ({
                id: `call_${index}_${i}`,
                type: 'function',
                function: { name: c.name, arguments: c.raw ?? JSON.stringify(c.args) },
              })),
            }
          : {}),
      };
      res.writeHead(200, { 'content-type': 'application/json' });
      if (next.stall_ms) {
        res.flushHeaders();
        await new Promise((r) => setTimeout(r, next.stall_ms));
        if (res.destroyed) return;
      }
      res.end(
        JSON.stringify({
          id: `chatcmpl-${index}`,
          object: 'chat.completion',
          model: body.model,
          choices: [{ index: 0, message, finish_reason: next.tool_calls?.length ? 'tool_calls' : 'stop' }],
          usage: { prompt_tokens: 10, completion_tokens: 5 },
        }),
      );
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`,
    requests,
    // a turn still delayed or stalling is cut, not waited out (server.close waited for each: 3-4 s of a timeout's test)
    close: () =>
      new Promise((r) => {
        server.close(() => r());
        server.closeAllConnections();
      }),
  };
}
