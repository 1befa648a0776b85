// The commands of automation-service. Client commands call a running service (--url/SERVICE_URL,
// --key/SERVICE_API_KEY); `keys` and `gates run|verify` work locally, and load the service's modules (its
// store, sandbox, gates) only when they run, so a client command starts fast. Built on commander: no
// dependencies of its own, nested commands with generated --help for each, and the most used parser of
// its kind, so its behaviour is what people already know.
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { Command, Option } from 'commander';
import { loadClientEnv, loadConfig, TENANT_ID_PATTERN } from '../config/env.js';
import type { ApiKeys } from '../engine/auth/index.js';
import type { Store } from '../engine/store/index.js';
import { ApiClient, ApiError, CliError, DEFAULT_IDLE_MS, DEFAULT_REQUEST_TIMEOUT_MS, EXIT } from './client.js';
import { outputOf, seconds, visible, type Output } from './output.js';
import { printRun, printRuns, usage, watchRun } from './runs.js';

const clientEnv = loadClientEnv();
const DEFAULT_URL = 'http://localhost:8080';

type Globals = { url?: string; key?: string; json?: boolean; requestTimeout?: number };

/** The options of every client command: where the service is, the key, and JSON output. */
function clientCommand(parent: Command, nameAndArgs: string): Command {
  return parent
    .command(nameAndArgs)
    .option('--url <url>', `the service (default: SERVICE_URL, else ${DEFAULT_URL})`, notAFlag('--url'))
    .option('--key <key>', 'an API key (default: SERVICE_API_KEY)', notAFlag('--key'))
    .option('--json', "print the service's JSON instead of lines and tables")
    .option(
      '--request-timeout <seconds>',
      `how long one call waits for the service's answer (default: ${DEFAULT_REQUEST_TIMEOUT_MS / 1000})`,
      positiveInt('--request-timeout'),
    );
}

function contextOf(cmd: Command): { client: ApiClient; o: Output } {
  const g = cmd.opts<Globals>();
  const url = g.url ?? clientEnv.url ?? DEFAULT_URL;
  let protocol: string;
  try {
    protocol = new URL(url).protocol;
  } catch {
    // never printed back: it may carry a password (https://user:secret@host:99999)
    throw usage('--url (or SERVICE_URL) is not a URL');
  }
  // anything else is a mistake in the command, not a service that is away: fetch would fail it as unreachable
  if (protocol !== 'http:' && protocol !== 'https:') throw usage('--url (or SERVICE_URL) must start with http:// or https://');
  const key = g.key ?? clientEnv.key;
  // a key that cannot be a header value (a newline pasted with it) would be printed back by fetch's own error
  if (key !== undefined && !/^[\x21-\x7e]+$/.test(key)) throw usage('--key (or SERVICE_API_KEY) holds characters no API key has (a space or a line break?)');
  const timeoutMs = g.requestTimeout === undefined ? undefined : g.requestTimeout * 1000;
  return { client: new ApiClient(url, key, fetch, timeoutMs), o: outputOf({ json: Boolean(g.json), noColor: clientEnv.noColor }) };
}

/**
 * An RFC 3339 date and time that names a real instant: Date.parse takes 2027-02-30 (and rolls it into March)
 * and 'March 7' (in 2001), so the text's shape is checked and its date read back.
 */
const isDateTime = (s: string) => {
  const m = /^(\d{4})-(\d{2})-(\d{2})T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/i.exec(s);
  if (!m) return false;
  const at = new Date(Date.UTC(Number(m[1]), Number(m[2]) - 1, Number(m[3])));
  return !Number.isNaN(Date.parse(s)) && at.getUTCFullYear() === Number(m[1]) && at.getUTCMonth() === Number(m[2]) - 1 && at.getUTCDate() === Number(m[3]);
};

const SEVERITIES = ['critical', 'high', 'medium', 'low'];

/** The most `timeout_seconds` the service's audit run waits (api/openapi.yaml, AuditRequest). */
const AUDIT_WAIT_MAX_SECONDS = 300;

/**
 * An audit's exit code: 1 when a finding is `failOn` or more severe; else 3 when a phase timed out and 1
 * when one failed (it audited nothing: zero findings there say nothing); else 0. With the phases not audited.
 */
export function auditExitCode(
  phases: { phase: string; status: string; counts?: Record<string, number> }[],
  failOn?: string,
): { code: number; unfinished: string[] } {
  const worst = failOn ? SEVERITIES.slice(0, SEVERITIES.indexOf(failOn) + 1) : [];
  const unfinished = phases.filter((p) => p.status !== 'completed').map((p) => `${p.phase} (${p.status})`);
  if (phases.some((p) => worst.some((s) => (p.counts?.[s] ?? 0) > 0))) return { code: EXIT.failed, unfinished };
  if (phases.some((p) => p.status === 'timed_out')) return { code: EXIT.timedOut, unfinished };
  if (unfinished.length) return { code: EXIT.failed, unfinished };
  return { code: EXIT.succeeded, unfinished };
}

const collect = (value: string, previous: string[] = []) => [...previous, value];
/**
 * A value no one means to start with `--`: commander takes the word after an option as its value, whatever it
 * is, so `--key $KEY --json` with KEY unset sent `Authorization: Bearer --json`. One dash (`--key=-abc`) is a
 * value. What follows a `=` in the word taken is not printed (`--key --token=...`).
 */
const notAFlag =
  (name: string) =>
  (value: string): string => {
    if (value.startsWith('--'))
      throw usage(`${name} needs a value, and the next word is the option ${value.split('=')[0]}: is a variable empty? (quote it: ${name} "$VALUE")`);
    return value;
  };
const collectValues = (name: string) => (value: string, previous?: string[]) => collect(notAFlag(name)(value), previous);
/**
 * An unknown option as commander names it without the value given with it (`--kye=sk_live_...`, a mistyped
 * --key; `-ksk_live_...`, a short option there is none of): error output reaches CI logs.
 */
export const withoutOptionValues = (text: string): string =>
  text.replace(/(unknown option '--[^'=]*)=[^']*'/g, "$1=...'").replace(/(unknown option '-[^-'])[^']+'/g, "$1...'");
/** The most seconds a timer waits (2^31 - 1 ms): a larger wait fired at once, and every call timed out. */
const MAX_SECONDS = 2_147_483;
const positiveInt = (name: string) => (value: string) => {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1 || n > MAX_SECONDS) throw usage(`${name} must be a whole number from 1 to ${MAX_SECONDS}, got "${value}"`);
  return n;
};
const keyValue =
  (name: string) =>
  (value: string, previous: Record<string, string> = {}) => {
    const at = value.indexOf('=');
    if (at < 1) throw usage(`${name} takes name=value, got "${value}"`);
    return { ...previous, [value.slice(0, at)]: value.slice(at + 1) };
  };

/** `--step 'shell:npm test'`: a tool and its main argument; `--step 'http:{"url":...}'` takes JSON args. */
function stepOf(spec: string): { tool: string; args: Record<string, unknown> } {
  const at = spec.indexOf(':');
  if (at < 1) throw usage(`--step takes tool:argument, as in 'shell:npm test', got "${spec}"`);
  const tool = spec.slice(0, at);
  const rest = spec.slice(at + 1);
  if (rest.trimStart().startsWith('{')) {
    try {
      return { tool, args: JSON.parse(rest) as Record<string, unknown> };
    } catch {
      throw usage(`--step ${tool}: the arguments are not JSON`);
    }
  }
  const main: Record<string, string> = { shell: 'command', http: 'url', read_file: 'path', list_files: 'path', message: 'text' };
  return { tool, args: { [main[tool] ?? 'input']: rest } };
}

/**
 * Everything on stdin, to its end. At a terminal the typing is not shown (raw mode: Enter starts a new
 * line, Backspace takes a character back, Ctrl-D ends, Ctrl-C gives up); piped, the stream as it is.
 */
async function readSecretInput(o: { err(s: string): void }): Promise<string> {
  const stdin = process.stdin;
  if (!stdin.isTTY) {
    const chunks: Buffer[] = [];
    for await (const chunk of stdin) chunks.push(chunk as Buffer);
    return Buffer.concat(chunks).toString('utf8');
  }
  stdin.setRawMode(true);
  stdin.setEncoding('utf8');
  let typed = '';
  try {
    return await new Promise<string>((resolve, reject) => {
      const onData = (chunk: string) => {
        for (const ch of chunk) {
          if (ch === '\u0004') return resolve(typed);
          if (ch === '\u0003') return reject(new CliError('canceled: nothing was set', EXIT.interrupted));
          if (ch === '\r' || ch === '\n') {
            typed += '\n';
            o.err('\n');
          } else if (ch === '\u007f' || ch === '\b') typed = typed.slice(0, -1);
          else typed += ch;
        }
      };
      stdin.on('data', onData);
    });
  } finally {
    stdin.setRawMode(false);
    stdin.removeAllListeners('data');
    stdin.pause();
    o.err('\n');
  }
}

/** The Idempotency-Key: the one given, else one derived from the CI job and the request (a re-run of the job is a new run). */
function idempotencyKeyOf(given: string | undefined, body: unknown): string | undefined {
  if (given) return given;
  if (!clientEnv.ciJob) return undefined;
  const digest = createHash('sha256').update(JSON.stringify(body)).digest('hex').slice(0, 16);
  return `${clientEnv.ciJob}-${digest}`.slice(-255);
}

/** The options of a command that follows a run's events; `when` says when they apply. */
const followOptions = (cmd: Command, when = '') =>
  cmd
    .option(
      '--cancel-on-interrupt',
      `${when}Ctrl-C cancels the run without asking (without this option Ctrl-C asks at a terminal, and elsewhere leaves the run going)`,
    )
    .option(
      '--idle-timeout <seconds>',
      `${when}reconnect when the event stream sends nothing this long, not even the service's heartbeat (default: ${DEFAULT_IDLE_MS / 1000})`,
      positiveInt('--idle-timeout'),
    );
const waitOptions = (cmd: Command) => followOptions(cmd.option('--wait', "follow the run's events to its end; the exit code is its status"), 'with --wait: ');

/** Examples under a command's --help: every command has some (the README says so). */
const examples = (...lines: string[]) => `\nExamples:\n${lines.map((l) => `  $ ${l}`).join('\n')}`;

async function startedRun(
  cmd: Command,
  accepted: { run_id: string; session_id: string; status?: string },
  opts: { wait?: boolean; cancelOnInterrupt?: boolean; idleTimeout?: number },
): Promise<number> {
  const { client, o } = contextOf(cmd);
  if (!opts.wait) {
    if (o.json) o.printJson(accepted);
    else o.out(`${visible(String(accepted.run_id))}\n`);
    return EXIT.succeeded;
  }
  if (!o.json) o.err(`run ${accepted.run_id} queued; following its events (Ctrl-C to stop)\n`, 'dim');
  return watchRun(
    client,
    o,
    { id: accepted.run_id, session_id: accepted.session_id, kind: '', status: 'queued' },
    { cancelOnInterrupt: opts.cancelOnInterrupt, idleTimeout: opts.idleTimeout },
  );
}

export function buildProgram(): Command {
  const program = new Command('automation-service')
    .description('Start and follow runs, manage automations and webhooks of an automation service; make keys and run gates locally.')
    .showHelpAfterError()
    .configureOutput({ outputError: (text, write) => write(withoutOptionValues(text)) })
    .exitOverride()
    .addHelpText(
      'after',
      `
Exit codes: 0 succeeded, 1 failed, 2 usage or auth error, 3 timed out, 4 canceled,
            5 the service could not be reached, failed, was too busy (429) or said when to retry (Retry-After),
            130 left running on Ctrl-C.

Examples:
  $ export SERVICE_URL=https://automation.example.com SERVICE_API_KEY=...
  $ automation-service run --step 'shell:npm ci' --step 'shell:npm test' --budget 600 --wait
  $ automation-service runs list --status failed
  $ automation-service automations run aut_01... --wait
  $ printf '%s' "$SECRET" | automation-service secrets set codehost`,
    );

  clientCommand(program, 'run')
    .description('start a budgeted autonomy run')
    .option('--step <tool:arg>', "a step, as in 'shell:npm test' (repeat for more; tool:{json} for full arguments)", collect)
    .option('--goal <text>', 'what the agent should reach (needs an agent configured on the service)')
    .option('--budget <seconds>', 'wall-clock budget', positiveInt('--budget'))
    .option('--max-steps <n>', 'at most this many steps', positiveInt('--max-steps'))
    .option('--workspace <dir>', "a folder of the tenant's workspace root, relative to it", notAFlag('--workspace'))
    .option(
      '--idempotency-key <key>',
      "the same key returns the first run (default: from the CI job's id on GitHub Actions, GitLab CI, CircleCI and Buildkite)",
      notAFlag('--idempotency-key'),
    )
    .addHelpText(
      'after',
      examples(
        "automation-service run --step 'shell:npm test' --budget 600 --wait",
        "automation-service run --goal 'fix the failing test' --max-steps 20 --wait --json",
      ),
    )
    .action(async function (this: Command, opts) {
      if (!opts.step?.length && !opts.goal) throw usage('give --step (one or more) or --goal');
      const body = {
        ...(opts.step?.length ? { steps: (opts.step as string[]).map(stepOf) } : {}),
        ...(opts.goal ? { goal: opts.goal } : {}),
        ...(opts.budget ? { budget_seconds: opts.budget } : {}),
        ...(opts.maxSteps ? { max_steps: opts.maxSteps } : {}),
        ...(opts.workspace ? { workspace: opts.workspace } : {}),
      };
      const key = idempotencyKeyOf(opts.idempotencyKey, body);
      const { client } = contextOf(this);
      const accepted = await client.request('POST', '/api/v1/autonomy/run', { body, headers: key ? { 'idempotency-key': key } : {} });
      process.exitCode = await startedRun(this, accepted, opts);
    });
  waitOptions(program.commands.at(-1)!);

  const runs = program.command('runs').description('runs of every kind: get, watch, cancel, list');
  clientCommand(runs, 'get <id>')
    .description('a run: status, steps, timings, error')
    .addHelpText('after', examples('automation-service runs get run_01...', 'automation-service runs get run_01... --json'))
    .action(async function (this: Command, id: string) {
      const { client, o } = contextOf(this);
      printRun(o, await client.request('GET', `/api/v1/runs/${encodeURIComponent(id)}`));
    });
  followOptions(clientCommand(runs, 'watch <id>').description("follow a run's events to its end; the exit code is its status"))
    .addHelpText('after', examples('automation-service runs watch run_01...', 'automation-service runs watch run_01... --cancel-on-interrupt'))
    .action(async function (this: Command, id: string, opts) {
      const { client, o } = contextOf(this);
      const run = await client.request('GET', `/api/v1/runs/${encodeURIComponent(id)}`);
      process.exitCode = await watchRun(client, o, run, opts);
    });
  clientCommand(runs, 'cancel <id>')
    .description('cancel a queued or running run')
    .addHelpText('after', examples('automation-service runs cancel run_01...'))
    .action(async function (this: Command, id: string) {
      const { client, o } = contextOf(this);
      const run = await client.request('POST', `/api/v1/runs/${encodeURIComponent(id)}/cancel`);
      if (o.json) o.printJson(run);
      else o.out(`${visible(`${run.id ?? id} ${run.status ?? 'cancel requested'}`)}\n`);
    });
  clientCommand(runs, 'list')
    .description('runs, newest first')
    .option('--automation <id>', "only this automation's runs", notAFlag('--automation'))
    .option('--status <status>', 'queued, running, succeeded, failed, canceled or timed_out', notAFlag('--status'))
    .option('--kind <kind>', 'autonomy, vibe or automation', notAFlag('--kind'))
    .option('--limit <n>', 'at most this many', positiveInt('--limit'))
    .option('--cursor <cursor>', 'the next page', notAFlag('--cursor'))
    .addHelpText('after', examples('automation-service runs list --status failed --limit 5', 'automation-service runs list --automation aut_01... --json'))
    .action(async function (this: Command, opts) {
      const { client, o } = contextOf(this);
      printRuns(
        o,
        await client.request('GET', '/api/v1/runs', {
          query: { automation_id: opts.automation, status: opts.status, kind: opts.kind, limit: opts.limit, cursor: opts.cursor },
        }),
      );
    });

  const automations = program.command('automations').description('reusable automations: list, get, run, enable, disable, archive');
  clientCommand(automations, 'list')
    .description('automations, newest first')
    .option('--status <status>', 'enabled, disabled or archived', notAFlag('--status'))
    .option('--limit <n>', 'at most this many', positiveInt('--limit'))
    .option('--cursor <cursor>', 'the next page', notAFlag('--cursor'))
    .addHelpText('after', examples('automation-service automations list --status enabled', 'automation-service automations list --json'))
    .action(async function (this: Command, opts) {
      const { client, o } = contextOf(this);
      const page = await client.request('GET', '/api/v1/automations', { query: { status: opts.status, limit: opts.limit, cursor: opts.cursor } });
      if (o.json) return o.printJson(page);
      o.table(page.data, [
        ['ID', (a) => a.id],
        ['NAME', (a) => a.name],
        ['STATUS', (a) => a.status],
        ['TRIGGERS', (a) => (a.triggers ?? []).map((t: { type: string }) => t.type).join(',') || '-'],
        ['UPDATED', (a) => a.updated_at],
      ]);
      if (page.next_cursor) o.out(`more: --cursor ${visible(page.next_cursor)}\n`);
    });
  clientCommand(automations, 'get <id>')
    .description('an automation')
    .addHelpText('after', examples('automation-service automations get aut_01...'))
    .action(async function (this: Command, id: string) {
      const { client, o } = contextOf(this);
      const a = await client.request('GET', `/api/v1/automations/${encodeURIComponent(id)}`);
      if (o.json) return o.printJson(a);
      o.out(`${visible(`${a.id}  ${a.name}  ${a.status}`)}\n`);
      for (const t of a.triggers ?? [])
        o.out(visible(`  trigger ${t.type}${t.schedule ? ` ${t.schedule}` : ''}${t.paths ? ` ${t.paths.join(' ')}` : ''}`) + '\n');
      for (const [i, s] of (a.steps ?? []).entries()) o.out(`${visible(`  step ${i + 1} ${s.tool} ${JSON.stringify(s.args ?? {})}`)}\n`);
    });
  const runAutomation = clientCommand(automations, 'run <id>')
    .description('run an automation now')
    .option('--input <name=value>', 'an input merged over the automation’s own (repeatable)', keyValue('--input'))
    .option('--idempotency-key <key>', 'the same key returns the first run', notAFlag('--idempotency-key'))
    .addHelpText(
      'after',
      examples(
        'automation-service automations run aut_01... --input ref=main --input env=staging',
        'automation-service automations run aut_01... --wait --cancel-on-interrupt',
      ),
    )
    .action(async function (this: Command, id: string, opts) {
      const { client } = contextOf(this);
      const body = { automation_id: id, ...(opts.input ? { inputs: opts.input } : {}) };
      const key = idempotencyKeyOf(opts.idempotencyKey, body);
      const accepted = await client.request('POST', '/api/v1/automations/run', { body, headers: key ? { 'idempotency-key': key } : {} });
      process.exitCode = await startedRun(this, accepted, opts);
    });
  waitOptions(runAutomation);
  for (const [verb, method, path, what] of [
    ['enable', 'POST', '/enable', 'enable an automation: its triggers fire again'],
    ['disable', 'POST', '/disable', 'disable an automation: its triggers stop firing'],
    ['archive', 'DELETE', '', 'archive an automation (kept with its history, never fires)'],
  ] as const) {
    clientCommand(automations, `${verb} <id>`)
      .description(what)
      .addHelpText('after', examples(`automation-service automations ${verb} aut_01...`))
      .action(async function (this: Command, id: string) {
        const { client, o } = contextOf(this);
        const a = await client.request(method, `/api/v1/automations/${encodeURIComponent(id)}${path}`);
        if (o.json) o.printJson(a);
        else o.out(`${visible(`${id} ${a?.status ?? `${verb}d`}`)}\n`);
      });
  }

  const templates = program.command('templates').description('automation templates: list, instantiate');
  clientCommand(templates, 'list')
    .description('the templates this service offers')
    .addHelpText('after', examples('automation-service templates list', 'automation-service templates list --json'))
    .action(async function (this: Command) {
      const { client, o } = contextOf(this);
      const list = await client.request('GET', '/api/v1/automations/templates');
      if (o.json) return o.printJson(list);
      o.table(list.data, [
        ['ID', (t) => t.id],
        ['NAME', (t) => t.name],
        ['VARIABLES', (t) => (t.variables ?? []).map((v: { name: string; required?: boolean }) => `${v.name}${v.required ? '*' : ''}`).join(',') || '-'],
      ]);
    });
  clientCommand(templates, 'instantiate <template-id>')
    .description('make an automation from a template')
    .option('--var <name=value>', 'a template variable (repeatable)', keyValue('--var'))
    .option('--name <name>', "the automation's name")
    .addHelpText(
      'after',
      examples("automation-service templates instantiate nightly-audit --var schedule='0 3 * * *' --var timezone=Europe/Paris --name 'Nightly audit'"),
    )
    .action(async function (this: Command, templateId: string, opts) {
      const { client, o } = contextOf(this);
      const a = await client.request('POST', '/api/v1/automations/templates/instantiate', {
        body: { template_id: templateId, variables: opts.var ?? {}, ...(opts.name ? { name: opts.name } : {}) },
      });
      if (o.json) o.printJson(a);
      else o.out(`${visible(`${a.id}  ${a.name}  ${a.status}`)}\n`);
    });

  const deliveries = program.command('deliveries').description('webhook deliveries: list, replay');
  clientCommand(deliveries, 'list')
    .description('webhook deliveries, newest first')
    .option('--kind <kind>', 'codehost, chat, tracker, pager, email or generic', notAFlag('--kind'))
    .option('--status <status>', "a delivery's status", notAFlag('--status'))
    .option('--limit <n>', 'at most this many', positiveInt('--limit'))
    .option('--cursor <cursor>', 'the next page', notAFlag('--cursor'))
    .addHelpText('after', examples('automation-service deliveries list --kind codehost --status failed', 'automation-service deliveries list --limit 5 --json'))
    .action(async function (this: Command, opts) {
      const { client, o } = contextOf(this);
      const page = await client.request('GET', '/api/v1/webhook-deliveries', {
        query: { kind: opts.kind, status: opts.status, limit: opts.limit, cursor: opts.cursor },
      });
      if (o.json) return o.printJson(page);
      o.table(page.data, [
        ['ID', (d) => d.id],
        ['KIND', (d) => d.kind],
        ['EVENT', (d) => d.event],
        ['STATUS', (d) => d.status],
        ['RECEIVED', (d) => d.received_at ?? d.created_at],
      ]);
      if (page.next_cursor) o.out(`more: --cursor ${visible(page.next_cursor)}\n`);
    });
  clientCommand(deliveries, 'replay <id>')
    .description('process a stored delivery again')
    .addHelpText('after', examples('automation-service deliveries replay whd_01...'))
    .action(async function (this: Command, id: string) {
      const { client, o } = contextOf(this);
      const d = await client.request('POST', `/api/v1/webhook-deliveries/${encodeURIComponent(id)}/replay`);
      if (o.json) o.printJson(d);
      else o.out(`${visible(`${d?.id ?? id} ${d?.status ?? 'replayed'}`)}\n`);
    });

  const secrets = program.command('secrets').description('webhook signing secrets (read from stdin, never from an argument)');
  clientCommand(secrets, 'set <kind>')
    .description("set a kind's signing secret from stdin: one line, or two while rotating (the new one first)")
    .addHelpText(
      'after',
      examples(
        `printf '%s' "$SECRET" | automation-service secrets set codehost`,
        `printf '%s\\n%s\\n' "$NEW_SECRET" "$OLD_SECRET" | automation-service secrets set codehost`,
      ),
    )
    .action(async function (this: Command, kind: string) {
      const { client, o } = contextOf(this);
      if (process.stdin.isTTY) o.err('secret (one line; a second line while rotating; end with Ctrl-D; not shown): ');
      const secrets = (await readSecretInput(o))
        .split(/\r?\n/)
        .map((s) => s.trim())
        .filter(Boolean);
      if (secrets.length < 1 || secrets.length > 2) throw usage('give one secret on stdin, or two lines while rotating (the new one first)');
      const info = await client.request('PUT', `/api/v1/webhook-secrets/${encodeURIComponent(kind)}`, { body: { secrets } });
      if (o.json) o.printJson(info);
      else o.out(`${kind}: ${secrets.length} secret${secrets.length > 1 ? 's' : ''} set\n`);
    });

  const sessions = program.command('sessions').description('multi-agent sessions: list, get');
  clientCommand(sessions, 'list')
    .description('sessions, newest first')
    .option('--status <status>', "a session's status", notAFlag('--status'))
    .option('--limit <n>', 'at most this many', positiveInt('--limit'))
    .addHelpText('after', examples('automation-service sessions list --limit 10', 'automation-service sessions list --json'))
    .action(async function (this: Command, opts) {
      const { client, o } = contextOf(this);
      const page = await client.request('GET', '/api/v1/sessions', { query: { status: opts.status, limit: opts.limit } });
      if (o.json) return o.printJson(page);
      o.table(page.data, [
        ['ID', (s) => s.id],
        ['TITLE', (s) => s.title],
        ['STATUS', (s) => s.status],
        ['OUTCOME', (s) => s.outcome],
        ['CREATED', (s) => s.created_at],
      ]);
    });
  clientCommand(sessions, 'get <id>')
    .description('a session with its agents and tasks')
    .addHelpText('after', examples('automation-service sessions get ses_01...'))
    .action(async function (this: Command, id: string) {
      const { client, o } = contextOf(this);
      const s = await client.request('GET', `/api/v1/sessions/${encodeURIComponent(id)}`);
      if (o.json) return o.printJson(s);
      o.out(`${visible(`${s.id}  ${s.title ?? ''}  ${s.status}${s.outcome ? ` (${s.outcome})` : ''}`)}\n`);
      for (const t of s.tasks ?? []) o.out(visible(`  task ${t.id} ${t.status}${t.depends_on?.length ? ` after ${t.depends_on.join(',')}` : ''}`) + '\n');
    });

  const audit = program.command('audit').description('workspace audits');
  clientCommand(audit, 'run')
    .description("audit a folder of the tenant's workspace; exits 1 when a finding reaches --fail-on")
    .option('--workspace <dir>', "a folder of the tenant's workspace root", notAFlag('--workspace'))
    .option('--phases <list>', 'comma-separated: security, architecture, sanity, health', notAFlag('--phases'))
    .option('--timeout <seconds>', 'wait this long for the report, exit 3 if it is not done (the audit goes on after)', positiveInt('--timeout'), 300)
    .addOption(new Option('--fail-on <severity>', 'exit 1 when a finding is this severe or more').choices(['critical', 'high', 'medium', 'low']))
    .addHelpText(
      'after',
      examples('automation-service audit run --fail-on high', 'automation-service audit run --workspace api --phases security,health --timeout 600'),
    )
    .action(async function (this: Command, opts) {
      const { client, o } = contextOf(this);
      const deadline = Date.now() + opts.timeout * 1000;
      // the service waits at most AUDIT_WAIT_MAX_SECONDS (a longer timeout_seconds is a 400); the rest of --timeout
      // the report is followed here
      const wait = Math.min(opts.timeout, AUDIT_WAIT_MAX_SECONDS);
      const body = {
        ...(opts.workspace ? { workspace: opts.workspace } : {}),
        ...(opts.phases ? { phases: String(opts.phases).split(',') } : {}),
        timeout_seconds: wait,
      };
      // the service answers within its wait (202 after it): the call waits that long, and a little more
      let report = await client.request('POST', '/api/v1/autonomy/workspace-audit/run', {
        body,
        timeoutMs: Math.max(client.timeoutMs, (wait + 30) * 1000),
      });
      // a 202 carries the phases ended so far (often none): the status says whether the audit is done
      for (let pause = 1000; report.status === 'running' && Date.now() < deadline; pause = Math.min(pause * 2, 5000)) {
        await new Promise((r) => setTimeout(r, Math.min(pause, deadline - Date.now())));
        // by its id, never the answer's Location as given: the key goes to the service's own address only
        report = await client.request('GET', `/api/v1/autonomy/workspace-audit/${encodeURIComponent(report.report_id)}`).catch((err: unknown) => {
          // refused for load while it follows: asked again at the next pause, while --timeout lasts
          if (err instanceof ApiError && err.retryAfterSeconds !== undefined) return report;
          throw err;
        });
      }
      if (o.json) o.printJson(report);
      if (report.status === 'running') {
        if (!o.json)
          o.out(
            `${visible(`audit ${report.report_id} still running after ${opts.timeout} s; get it with GET /api/v1/autonomy/workspace-audit/${report.report_id}`)}\n`,
          );
        process.exitCode = EXIT.timedOut;
        return;
      }
      if (!o.json)
        for (const p of report.phases)
          o.out(`${visible(`${String(p.phase).padEnd(13)} ${String(p.status).padEnd(10)} ${JSON.stringify(p.counts ?? {})}  ${seconds(p.duration_ms)}`)}\n`);
      const { code, unfinished } = auditExitCode(report.phases, opts.failOn);
      if (unfinished.length) process.stderr.write(`automation-service: not audited: ${visible(unfinished.join(', '))}\n`);
      process.exitCode = code;
    });

  const keys = program.command('keys').description('API keys of a tenant, in the service’s store (local: MONGODB_URI or SERVICE_DATA_DIR)');
  /**
   * The service's store and its key manager, for one command. Only `create` may make the store: a list or a
   * revoke run outside the service's folder read a store it had just made, printed `(none)` (or refused the
   * key as unknown) and exited 0. Which store was read is said on stderr, every time.
   */
  const withKeys = async <T>(tenant: string, use: 'create' | 'read', fn: (apiKeys: ApiKeys, store: Store, where: string) => Promise<T>): Promise<T> => {
    if (!TENANT_ID_PATTERN.test(tenant)) throw usage('--tenant: letters, digits, _ or -, at most 64');
    const config = loadConfig();
    // where the keys are: a store made here and now (the command run outside the service's folder) is said to be new
    const file = path.resolve(config.dataDir, 'service.sqlite');
    const isNew = !config.mongodbUri && !existsSync(file);
    if (isNew && use === 'read')
      throw usage(
        `no key store at ${file}: set SERVICE_DATA_DIR to the service's data folder (or MONGODB_URI to its MongoDB), or run this where the service runs`,
      );
    const where = config.mongodbUri ? 'the MongoDB store of MONGODB_URI' : `${isNew ? 'a new ' : ''}SQLite store ${file}`;
    if (use === 'read') process.stderr.write(`keys of tenant ${tenant} in ${where}\n`);
    const [{ apiKeysOf }, { systemClock, createLogger, stderrDestination }, { openStore }] = await Promise.all([
      import('../engine/auth/index.js'),
      import('../engine/platform/index.js'),
      import('../engine/store/index.js'),
    ]);
    const store = await openStore({ mongodbUri: config.mongodbUri, dataDir: config.dataDir });
    try {
      return await fn(apiKeysOf({ store, clock: systemClock, log: createLogger('warn', stderrDestination()) }), store, where);
    } finally {
      await store.close();
    }
  };
  keys
    .command('create')
    .description("make an API key for a tenant; printed once, stored hashed (uses the service's environment: MONGODB_URI or SERVICE_DATA_DIR)")
    .requiredOption('--tenant <tenant>', 'the tenant it belongs to', notAFlag('--tenant'))
    .option('--label <text>', 'what the key is for')
    .option('--expires <date>', 'when it stops working (an ISO 8601 date and time)')
    .addHelpText(
      'after',
      examples(
        "automation-service keys create --tenant acme --label 'GitHub Actions'",
        'automation-service keys create --tenant acme --expires 2027-01-31T00:00:00Z',
      ),
    )
    .action(async (opts: { tenant: string; label?: string; expires?: string }) => {
      if (opts.expires && !isDateTime(opts.expires)) throw usage('--expires: an ISO 8601 date and time, e.g. 2027-01-31T00:00:00Z');
      await withKeys(opts.tenant, 'create', async (apiKeys, _store, where) => {
        const expires_at = opts.expires ? new Date(opts.expires).toISOString() : null;
        const created = await apiKeys.create(opts.tenant, { label: opts.label, source: 'cli', expires_at });
        // a new store is not the service's unless it runs with this SERVICE_DATA_DIR: said, so a key that opens nothing is not a surprise
        const hint = where.startsWith('a new') ? ' (the service must run with this SERVICE_DATA_DIR for the key to open it)' : '';
        process.stderr.write(`Created key ${created.record.id} for tenant ${created.record.tenant_id} in ${where}${hint}. It is shown once:\n`);
        process.stdout.write(`${created.key}\n`);
      });
    });
  keys
    .command('list')
    .description("a tenant's keys: id, label, source, state, last use (never the keys)")
    .requiredOption('--tenant <tenant>', 'the tenant', notAFlag('--tenant'))
    .option('--json', 'print the keys as JSON')
    .addHelpText('after', examples('automation-service keys list --tenant acme'))
    .action(async (opts: { tenant: string; json?: boolean }) => {
      await withKeys(opts.tenant, 'read', async (apiKeys) => {
        const list = (await apiKeys.list(opts.tenant)).map(({ hash: _hash, ...k }) => k);
        const o = outputOf({ json: Boolean(opts.json), noColor: clientEnv.noColor });
        if (o.json) return o.printJson(list);
        const now = Date.now();
        const state = (k: Record<string, string | null>) =>
          k.revoked_at ? `revoked ${k.revoked_at}` : k.expires_at && Date.parse(k.expires_at) <= now ? `expired ${k.expires_at}` : 'active';
        o.table(list, [
          ['ID', (k) => k.id],
          ['LABEL', (k) => k.label],
          ['SOURCE', (k) => k.source],
          ['STATE', state],
          ['LAST USED', (k) => k.last_used_at ?? 'never'],
        ]);
      });
    });
  keys
    .command('revoke <id>')
    .description('revoke a key: every process refuses it from its next request')
    .requiredOption('--tenant <tenant>', 'the tenant it belongs to', notAFlag('--tenant'))
    .option('--cascade', 'also revoke every key made with it, all the way down (a leaked key)')
    .addHelpText(
      'after',
      examples('automation-service keys revoke key_01... --tenant acme', 'automation-service keys revoke key_01... --tenant acme --cascade'),
    )
    .action(async (id: string, opts: { tenant: string; cascade?: boolean }) => {
      await withKeys(opts.tenant, 'read', async (apiKeys) => {
        const { key: k, cascaded } = await apiKeys.revoke(opts.tenant, id, { cascade: opts.cascade });
        process.stderr.write(`Revoked key ${k.id} of tenant ${k.tenant_id} at ${k.revoked_at}\n`);
        for (const c of cascaded) process.stderr.write(`Revoked key ${c.id}, made with it (${c.created_by})\n`);
      });
    });

  const gates = program.command('gates').description("the workspace's gates, run locally; evidence packs checked offline");
  gates
    .command('run')
    .description("run the workspace's gates (gates.yaml, or those detected), each in the sandbox; exits 1 when a required gate does not pass")
    .option('--workspace <dir>', 'the workspace', notAFlag('--workspace'), '.')
    .option('--only <id>', 'only this gate (repeatable)', collectValues('--only'))
    .option('--record', "seal the results into the service's ledger (its store and SERVICE_EVIDENCE_KEY, from the environment)")
    .option('--tenant <tenant>', 'with --record: the tenant whose ledger it joins', notAFlag('--tenant'))
    .option('--json', 'print the results as JSON')
    .addHelpText('after', examples('automation-service gates run', 'automation-service gates run --workspace ../api --only test --record --tenant acme'))
    .action(async function (this: Command, opts) {
      const { gatesRun } = await import('./gates.js');
      process.exitCode = await gatesRun(opts, (t) => void process.stdout.write(t));
    });
  gates
    .command('verify <pack>')
    .description(
      'check an evidence pack (.tar, or its pack.json) offline: signature, hash chain, payload digests; exits 1 naming the first bad entry, 3 when it holds but no --key pinned the service key',
    )
    .option(
      '--key <public-key>',
      "the service's public key (the base64 line of the evidence-pack answer's public_key.pem), or its key id (public_key.key_id, 64 bits)",
      notAFlag('--key'),
    )
    .option('--tenant <tenant>', 'the tenant the pack must be about (the service signs every tenant’s packs with one key)', notAFlag('--tenant'))
    .option('--json', 'print the verdict as JSON')
    .addHelpText(
      'after',
      examples('automation-service gates verify evidence.tar --key MCowBQYDK2VwAyEAXNmmwV5Krr/D1/4993/KgzAlB6sTmx0kRGncHMj6PJU= --tenant acme'),
    )
    .action(async (pack: string, opts: { key?: string; tenant?: string; json?: boolean }) => {
      const { gatesVerify } = await import('./gates.js');
      process.exitCode = await gatesVerify(pack, opts, (t) => void process.stdout.write(t));
    });
  return program;
}
