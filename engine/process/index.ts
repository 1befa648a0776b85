// Process start-up and shutdown: the runtime opens every connection in order and closes it in
// reverse; the lifecycle turns start-up errors into one line and SIGTERM into a graceful stop.
export * from './lifecycle.js';
export * from './runtime.js';
