// The gates capability: a workspace's gate set, running its gates in the sandbox, gate runs as BullMQ
// flows sealed into the evidence ledger, and readiness snapshots (smart gates).
export { GATE_FILES, loadGateSet, type GateDefinition, type GateSet, type ReportFormat } from './definition.js';
export { parseReport, readReport, type Report } from './reports.js';
export { scanFileSecrets, type SecretFound } from './secret-scan.js';
export { gateEnv, gatesOnCopy, inputDigest, maskedTail, runGate, runGateSet, subjectOf, type ArtifactPayload, type GateContext } from './runner.js';
export { FileHasher, gitState, inputFiles, type GitState } from './subject.js';
export { gateRunsOf, sealGateRun, type GateJob, type GateRuns } from './gate-runs.js';
export { evidencePacksOf, PREDICATE_TYPE, type EvidencePack, type EvidencePacks } from './pack.js';
export { smartGatesOf, type GateState, type SmartGates, type SmartGatesService } from './smart.js';
