// The workspace audit. So far: where an audit may look (roots.ts); the phases, their flow and the
// reports come next (issue 13).
export { resolveAuditRoot, type AuditRootPolicy } from './roots.js';
