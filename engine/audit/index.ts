// The workspace audit: where an audit may look (roots.ts), its four phases run in the sandbox as a
// BullMQ flow (audits.ts, run-phase.ts, phases/), and its reports kept in Redis (reports.ts).
export { resolveAuditRoot, type AuditRootPolicy } from './roots.js';
export { auditsOf, type AuditJob, type AuditRequest, type Audits, type AuditSettings, type GateHealth } from './audits.js';
