// Runs: one execution of work of any kind, its transitions, the executor, the agent loop, tenant
// concurrency and workspaces.
export * from './agent.js';
export * from './concurrency.js';
export * from './executor.js';
export * from './runs.js';
export * from './workspace.js';
