// The platform: what every capability uses. Redis and the queues, the typed event log, ids, the
// clock, the error hierarchy, logging, metrics and sealing of secrets. It imports no capability.
export * from './addresses.js';
export * from './admission.js';
export * from './mail.js';
export * from './canonical.js';
export * from './clock.js';
export * from './errors.js';
export * from './event-types.js';
export * from './events.js';
export * from './http-refusals.js';
export * from './ids.js';
export * from './inside.js';
export * from './json-depth.js';
export * from './log.js';
export * from './mask.js';
export * from './metrics.js';
export * from './queues.js';
export * from './redis.js';
export * from './redis-url.js';
export * from './redis-batch.js';
export * from './secret-box.js';
export * from './shutdown.js';
export * from './stats.js';
export * from './temp.js';
export * from './records.js';
export * from './watch-share.js';
export * from './git-binary.js';
