// Outdated dependencies, from the npm registry's abbreviated metadata. The service asks (the phase's
// sandbox has no network); when no registry answers, the check is neutral: no findings, and the
// metric says it could not be made.
import semver from 'semver';
import type { AuditFinding } from '../platform/index.js';

const CONCURRENCY = 8;
const REQUEST_TIMEOUT_MS = 3000;
const MAX_CHECKED = 200;
/**
 * What npm takes as a package's name (validate-npm-package-name's rules for a new package, lowercase): the name
 * becomes the path of a request the service makes outside the sandbox, so a workspace's package.json must not
 * choose it ("../../admin/delete?all=1" reached the registry host's /admin/delete).
 */
const NPM_NAME = /^(@[a-z0-9-~][a-z0-9-._~]*\/)?[a-z0-9-~][a-z0-9-._~]*$/;
const NPM_NAME_MAX = 214;
export const isNpmName = (name: string) => name.length <= NPM_NAME_MAX && NPM_NAME.test(name);
/** a valid name's path on the registry, every part of it encoded: `@scope%2Fname`, as npm's own client asks */
const registryPath = (name: string) => (name.startsWith('@') ? `@${encodeURIComponent(name.slice(1))}` : encodeURIComponent(name));

export type OutdatedCheck = {
  /** invalid_names: declared names that are not npm names, never looked up */
  metrics: { status: 'checked' | 'unknown' | 'off'; checked: number; outdated: number; unanswered: number; invalid_names: number };
  findings: AuditFinding[];
};

export async function checkOutdated(
  dependencies: { name: string; range: string; locked: string | null }[],
  registryUrl: string | null,
  fetchImpl: typeof fetch = fetch,
): Promise<OutdatedCheck> {
  if (!registryUrl) return { metrics: { status: 'off', checked: 0, outdated: 0, unanswered: 0, invalid_names: 0 }, findings: [] };
  const invalid = dependencies.filter((d) => !isNpmName(d.name)).length;
  // the names are not quoted: what a report quotes of the workspace is masked in the phase, and this runs outside it
  const named: AuditFinding[] = invalid
    ? [
        {
          rule: 'dependency-name-invalid',
          severity: 'low',
          file: 'package.json',
          line: null,
          message: `${invalid} declared dependenc${invalid === 1 ? 'y is' : 'ies are'} not named as npm names are, so not looked up in the registry`,
        },
      ]
    : [];
  const candidates = dependencies
    .filter((d) => isNpmName(d.name))
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
        const res = await fetchImpl(`${base}/${registryPath(d.name)}`, {
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
  return {
    metrics: { status, checked: answered, outdated: findings.length, unanswered, invalid_names: invalid },
    findings: [...named, ...(status === 'unknown' ? [] : findings)],
  };
}
