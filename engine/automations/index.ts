// Automations: reusable definitions of work, their templates and triggers (cron triggers and their ticker, file
// triggers), and how a trigger starts a run.
export * from './automations.js';
export * from './file-triggers.js';
export * from './fire.js';
export * from './overlap.js';
export * from './schedules.js';
export * from './templates.js';
export * from './triggers.js';
