// Middlewares run one after another as one Express layer. Every request walks each layer Express has: a
// path match, the URL trimmed and put back for a mounted one, a closure, a `next` through the router.
// The API's own steps before its routes (who is calling, its rate, its body, the spec's checks) are
// always walked together, so they are one layer: about a tenth of bare Express's cost a request.
import type { NextFunction, Request, RequestHandler, Response } from 'express';

/**
 * One handler that runs `handlers` in order, as Express would run them as layers of their own (for the
 * handlers that do not call `next('route')` or `next('router')`): an error passed to `next`, thrown, or a
 * promise rejected goes to the error handlers and skips the rest; a handler that answers and does not
 * call `next` ends the chain.
 */
export function chain(...handlers: RequestHandler[]): RequestHandler {
  return (req: Request, res: Response, next: NextFunction) => {
    let i = 0;
    const step = (err?: unknown): void => {
      if (err) return next(err);
      const handler = handlers[i++];
      if (!handler) return next();
      try {
        const ret = handler(req, res, step) as unknown;
        // as Express 5 does with a handler's promise
        if (ret instanceof Promise) ret.then(undefined, (error: unknown) => next(error || new Error('Rejected promise')));
      } catch (error) {
        next(error);
      }
    };
    step();
  };
}
