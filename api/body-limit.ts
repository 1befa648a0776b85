// A body whose declared length is over its route's limit is refused at once, before a byte of it is
// read. body-parser answers only once it has read (and dropped) the whole body, so a client that
// declared 2 GB and sent nothing held its request open until the server's own timeout. The connection
// closes after the answer: the body that was announced is never read.
import type { NextFunction, Request, Response } from 'express';
import { PayloadTooLargeError } from '../engine/platform/index.js';

/** Refuses (413, then closes) a request whose Content-Length is over `limitBytes`; else goes on. */
export function refuseDeclaredOver(limitBytes: number, req: Request, res: Response, next: NextFunction): boolean {
  const declared = Number(req.headers['content-length']);
  if (!(declared > limitBytes)) return false;
  res.setHeader('Connection', 'close');
  next(new PayloadTooLargeError(`The body is over the ${limitBytes / 1024 / 1024} MB limit.`));
  return true;
}
