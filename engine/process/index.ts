// Process start-up and shutdown: the runtime opens every connection in order and closes it in
// reverse; the lifecycle turns start-up errors into one line and SIGTERM into a graceful stop; a
// private redis-server stands in for Redis on a machine that has none running.
export * from './lifecycle.js';
export * from './local-redis.js';
export * from './runtime.js';
