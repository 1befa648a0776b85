// Webhook intake: verification per provider, the delivery outbox, replays.
export * from './webhooks.js';
export * from './verify.js';
