// Who may call: API keys, hashed at rest and bound to one tenant.
export * from './api-keys.js';
export * from './admin.js';
export * from './rate-limit.js';
export * from './sso.js';
