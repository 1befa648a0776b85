// Answers refused at the HTTP edge, in the service's problem shape (problem+json with a stable code and a
// request id, as every other error): what Node's parser refuses before a request exists, and what a small
// server of the service's own (a worker's metrics port) refuses.
import { randomUUID } from 'node:crypto';
import { STATUS_CODES, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { ERROR_STATUS, type ErrorCode } from './errors.js';
import type { Logger } from './log.js';

/** A problem's title: its status's reason phrase. */
const titleOf = (code: ErrorCode) => STATUS_CODES[ERROR_STATUS[code]] ?? 'Error';

/** A problem's body: `/problems/{code}`, its title, status and code, what it says, the request's id and path. */
export function problemBody(code: ErrorCode, detail: string, requestId: string, instance?: string): string {
  return JSON.stringify({
    type: `/problems/${code}`,
    title: titleOf(code),
    status: ERROR_STATUS[code],
    code,
    detail,
    request_id: requestId,
    ...(instance ? { instance } : {}),
  });
}

/** Answers a problem with a new request id (in its body and X-Request-Id), on a plain Node server. */
export function answerProblem(res: ServerResponse, code: ErrorCode, detail: string, instance: string, headers: Record<string, string> = {}): void {
  const requestId = randomUUID();
  res.writeHead(ERROR_STATUS[code], { 'content-type': 'application/problem+json; charset=utf-8', 'x-request-id': requestId, ...headers });
  res.end(problemBody(code, detail, requestId, instance));
}

/** What Node refuses before a request exists (its parser's errors), as problems like every other error; the socket then closes. */
const CLIENT_ERRORS: Record<string, { code: ErrorCode; detail: string }> = {
  HPE_HEADER_OVERFLOW: { code: 'headers-too-large', detail: "The request's headers are over the limit (16 KB)." },
  ERR_HTTP_REQUEST_TIMEOUT: { code: 'request-timeout', detail: 'The request was not received in time.' },
};

export function answerClientError(err: Error & { code?: string }, socket: Duplex, log: Logger): void {
  // an answer of this connection owed or under way (an event stream, a long-poll, a pipelined request's answer):
  // what the parser refused after that request is told by the close. Written, a 400 landed in the middle of that
  // answer's body (a chunked stream's next chunk was `HTTP/1.1 400 ...`), or was read as that request's answer
  const answering = (socket as Duplex & { _httpMessage?: unknown })._httpMessage;
  if (!socket.writable || answering) return void socket.destroy();
  const { code, detail } = CLIENT_ERRORS[err.code ?? ''] ?? { code: 'bad-request' as const, detail: 'The request could not be read as HTTP.' };
  const status = ERROR_STATUS[code];
  // an id like every request's, so that what the client was told can be found in the log
  const requestId = randomUUID();
  log.info({ req_id: requestId, code, status, reason: err.code }, 'request refused before it was read');
  const body = problemBody(code, detail, requestId);
  socket.end(
    `HTTP/1.1 ${status} ${titleOf(code)}\r\nContent-Type: application/problem+json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nX-Request-Id: ${requestId}\r\nConnection: close\r\n\r\n${body}`,
  );
}
