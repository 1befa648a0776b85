// Sessions: run sessions (one per autonomy or vibe run) and multi-agent sessions with agents and a
// durable message log.
export { sessionsOf, type Sessions, type SessionsDeps } from './sessions.js';
