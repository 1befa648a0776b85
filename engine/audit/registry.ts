// Outdated dependencies, from the npm registry's abbreviated metadata. The service asks (the phase's
// sandbox has no network); when no registry answers, the check is neutral: no findings, and the
// metric says it could not be made.
import semver from 'semver';
import type { AuditFinding } from '../platform/index.js';

const CONCURRENCY = 8;
const REQUEST_TIMEOUT_MS = 3000;
const MAX_CHECKED = 200;

export type OutdatedCheck = {
  metrics: { status: 'checked' | 'unknown' | 'off'; checked: number; outdated: number; unanswered: number };
  findings: AuditFinding[];
};

export async function checkOutdated(
  dependencies: { name: string; range: string; locked: string | null }[],
  registryUrl: string | null,
  fetchImpl: typeof fetch = fetch,
): Promise<OutdatedCheck> {
  if (!registryUrl) return { metrics: { status: 'off', checked: 0, outdated: 0, unanswered: 0 }, findings: [] };
  const candidates = dependencies
    .map((d) => ({ ...d, current: d.locked ?? (semver.validRange(d.range) ? semver.minVersion(d.range)?.version : null) }))
    .filter((d): d is typeof d & { current: string } => Boolean(d.current))
    .slice(0, MAX_CHECKED);
  const findings: AuditFinding[] = [];
  let answered = 0;
  let unanswered = 0;
  const base = registryUrl.replace(/\/+$/, '');
  let next = 0;
  const worker = async () => {
    while (next < candidates.length) {
      const d = candidates[next++]!;
      try {
        const res = await fetchImpl(`${base}/${d.name.replace('/', '%2F')}`, {
          headers: { accept: 'application/vnd.npm.install-v1+json' },
          signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
        });
        if (!res.ok) {
          unanswered++;
          continue;
        }
        const latest = ((await res.json()) as { 'dist-tags'?: { latest?: string } })['dist-tags']?.latest;
        answered++;
        if (!latest || !semver.valid(latest) || !semver.lt(d.current, latest)) continue;
        const major = semver.major(latest) > semver.major(d.current);
        findings.push({
          rule: major ? 'outdated-major' : 'outdated',
          severity: major ? 'low' : 'info',
          file: 'package.json',
          line: null,
          message: `${d.name} ${d.current} is behind ${latest}${major ? ' (a major version)' : ''}`,
        });
      } catch {
        unanswered++;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(CONCURRENCY, candidates.length) }, worker));
  const status = candidates.length && !answered ? 'unknown' : 'checked';
  return { metrics: { status, checked: answered, outdated: findings.length, unanswered }, findings: status === 'unknown' ? [] : findings };
}
