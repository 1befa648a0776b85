// What the command-line tool reads before it knows its command, apart from the service's own
// configuration (env.ts, which re-exports these): a client command loads nothing of the service.
export class ConfigError extends Error {
  constructor(readonly problems: string[]) {
    super(`invalid environment:\n${problems.map((p) => `  - ${p}`).join('\n')}`);
    this.name = 'ConfigError';
  }
}

export const TENANT_ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$/;

/** What the command-line tool's client commands read from the environment. */
export type ClientEnv = {
  /** SERVICE_URL, default http://localhost:8080 */
  url: string | undefined;
  /** SERVICE_API_KEY */
  key: string | undefined;
  /** NO_COLOR set (to anything): never colour */
  noColor: boolean;
  /** the CI job this runs in, when a known CI's variables say so: the base of a default Idempotency-Key */
  ciJob: string | undefined;
};

/** The CI job's identity: GitHub Actions, GitLab CI, CircleCI, Buildkite; a re-run of the job is a new one. */
function ciJobOf(env: Record<string, string | undefined>): string | undefined {
  if (env.GITHUB_ACTIONS === 'true' && env.GITHUB_RUN_ID)
    return `github-${env.GITHUB_REPOSITORY ?? ''}-${env.GITHUB_RUN_ID}-${env.GITHUB_RUN_ATTEMPT ?? '1'}-${env.GITHUB_JOB ?? ''}`;
  if (env.GITLAB_CI === 'true' && env.CI_JOB_ID) return `gitlab-${env.CI_PROJECT_ID ?? ''}-${env.CI_JOB_ID}`;
  if (env.CIRCLECI === 'true' && (env.CIRCLE_WORKFLOW_JOB_ID || env.CIRCLE_BUILD_NUM))
    return `circleci-${env.CIRCLE_WORKFLOW_JOB_ID ?? `${env.CIRCLE_PROJECT_REPONAME ?? ''}-${env.CIRCLE_BUILD_NUM}`}`;
  if (env.BUILDKITE === 'true' && env.BUILDKITE_JOB_ID) return `buildkite-${env.BUILDKITE_JOB_ID}`;
  return undefined;
}

export function loadClientEnv(env: Record<string, string | undefined> = process.env): ClientEnv {
  return {
    url: env.SERVICE_URL?.trim() || undefined,
    key: env.SERVICE_API_KEY?.trim() || undefined,
    noColor: env.NO_COLOR !== undefined && env.NO_COLOR !== '',
    ciJob: ciJobOf(env),
  };
}
