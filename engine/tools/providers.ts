// The action tools: codehost, chat, tracker, pager and email, one per provider. Each takes an
// `action` and its arguments, and acts through the run's connection to that provider (the engine's
// connections capability holds the SDK clients); what the provider answers is the step's output.
import { assertPublicHost, maskCredential, tempPrefix, type ConnectionProvider } from '../platform/index.js';
import fs from 'node:fs/promises';
import path from 'node:path';
import { runProcess } from './process.js';
import { stringArg, ToolError, type Tool, type ToolContext, type ToolResult } from './tool.js';

const repository = { type: 'string', description: 'owner/name' };
const number = { type: 'integer', minimum: 1, description: 'the pull request (or issue) number' };
const checkOutput = {
  type: 'object',
  required: ['title', 'summary'],
  properties: {
    title: { type: 'string' },
    summary: { type: 'string', description: 'Markdown' },
    annotations: {
      type: 'array',
      maxItems: 50,
      items: {
        type: 'object',
        required: ['path', 'start_line', 'message'],
        properties: {
          path: { type: 'string' },
          start_line: { type: 'integer' },
          end_line: { type: 'integer' },
          annotation_level: { type: 'string', enum: ['notice', 'warning', 'failure'] },
          message: { type: 'string' },
          title: { type: 'string' },
        },
      },
    },
  },
};
const connection = { type: 'string', description: "A connection's id or name; leave it out to use the run's (or the tenant's only one)." };

function actionTool(provider: ConnectionProvider, description: string, actions: Record<string, Record<string, unknown>>): Tool {
  return {
    name: provider,
    description,
    parameters: {
      type: 'object',
      required: ['action'],
      properties: { action: { type: 'string', enum: Object.keys(actions) }, connection, ...Object.assign({}, ...Object.values(actions)) },
    },
    async execute(args, ctx) {
      if (!ctx.connections) throw new ToolError('tool-unavailable', 'connections are not reachable from this run');
      const action = stringArg(args, 'action');
      // its own actions only: `in` would take what every object inherits (`constructor`, `toString`)
      if (!Object.hasOwn(actions, action)) throw new ToolError('invalid-args', `args.action must be one of ${Object.keys(actions).join(', ')}`);
      return { output: await ctx.connections.act(provider, action, args) };
    },
  };
}

const codehostActions = actionTool(
  'codehost',
  'Act on the code host (GitHub): check out a ref (a pull request head) into the workspace, comment on a pull request, submit a review with line comments, create or update a check run, open a pull request from a vibe run’s diff.',
  {
    checkout: {
      ref: { type: 'string', description: 'what to fetch: refs/pull/<n>/head, a branch or a commit' },
      expect_sha: { type: 'string', description: 'the commit the ref must be at (a push event’s `after`): otherwise the step fails, checkout-moved' },
    },
    comment: { repository, number, body: { type: 'string' } },
    review: {
      event: { type: 'string', enum: ['COMMENT', 'APPROVE', 'REQUEST_CHANGES'] },
      commit_id: { type: 'string' },
      comments: {
        type: 'array',
        items: {
          type: 'object',
          required: ['path', 'line', 'body'],
          properties: { path: { type: 'string' }, line: { type: 'integer' }, side: { type: 'string', enum: ['LEFT', 'RIGHT'] }, body: { type: 'string' } },
        },
      },
    },
    create_check_run: {
      name: { type: 'string' },
      head_sha: { type: 'string' },
      conclusion: { type: 'string' },
      output: checkOutput,
      details_url: { type: 'string' },
    },
    update_check_run: { check_run_id: { type: 'integer' } },
    open_pull_request: {
      run_id: { type: 'string', description: 'the vibe run whose diff becomes the pull request' },
      base: { type: 'string', description: 'the branch it goes into (default main)' },
      head: { type: 'string', description: 'the new branch' },
      title: { type: 'string' },
    },
  },
);

const REF = /^(?!-)[\w./-]{1,250}$/;
const REPOSITORY = /^[\w.-]+\/[\w.-]+$/;
const CHECKOUT_OUTPUT_MAX = 16 * 1024;
// a fresh repository (made by the service, so no config of a run's own making): fetch, then put its files at what was
// fetched. Its git folder is a private one of the service's (GIT_DIR), never the checkout's `.git`: another run's
// step of the tenant, which can write in the checkout folder, could put config there (hooks, an fsmonitor, a proxy)
// that git would obey in this process, the one with the network and the token
const CHECKOUT = 'git init -q && git fetch -q --no-tags "$REMOTE" "$REF" && git checkout -q --force --detach FETCH_HEAD && git rev-parse HEAD';

/**
 * Where git is to fetch from and, unless private addresses are allowed, the addresses it must connect to
 * there. The code host's name is looked up and checked here, and git's curl is given the addresses checked
 * (http.curloptResolve): its own lookup of the name a moment later could be answered otherwise (DNS
 * rebinding) and take the token to loopback or the internal network. The remote is written from the same
 * parse as the check's (host lowercased, in punycode, an address in its usual form): curl takes a given
 * address only for the host exactly as the URL names it, and looks up any other itself.
 */
async function pinnedRemote(webUrl: string, allowPrivate: boolean): Promise<{ base: string; resolve: string | null }> {
  const web = new URL(webUrl);
  const base = `${web.origin}${web.pathname.replace(/\/+$/, '')}`;
  const checked = await assertPublicHost(web, allowPrivate);
  if (!checked.length) return { base, resolve: null };
  const port = web.port || (web.protocol === 'https:' ? '443' : '80');
  return { base, resolve: `${web.hostname}:${port}:${[...new Set(checked)].map((a) => (a.includes(':') ? `[${a}]` : a)).join(',')}` };
}

/**
 * Fetches a ref of the repository from the code host into a fresh folder of the run's (the steps after
 * it work there), in the sandbox, with the network for this process only. The token reaches git only in
 * a config file of the service's (mode 0600, in a private folder bound read-only), as a header git sends
 * to the code host's address alone: never in an argument, the environment, the remote URL or the output.
 * Git connects only to the addresses checked (pinnedRemote). System and user git config are not read.
 */
async function checkout(args: Record<string, unknown>, ctx: ToolContext): Promise<ToolResult> {
  if (!ctx.connections || !ctx.checkouts) throw new ToolError('tool-unavailable', 'checkouts are not possible from this run');
  const repo = stringArg(args, 'repository');
  const ref = stringArg(args, 'ref');
  if (!REPOSITORY.test(repo)) throw new ToolError('invalid-args', 'args.repository must be owner/name');
  if (!REF.test(ref)) throw new ToolError('invalid-args', 'args.ref must be a ref name or a commit');
  if (!ctx.networkAllowed)
    throw new ToolError('network-required', 'checking out fetches from the code host: the operator must allow it (SERVICE_SANDBOX_ALLOW_NETWORK=1)');
  const access = await ctx.connections.git(typeof args.connection === 'string' ? args.connection : undefined);
  const { base, resolve } = await pinnedRemote(access.web_url, ctx.httpAllowPrivate);
  const remote = `${base}/${repo}.git`;
  const secrets = await fs.mkdtemp(tempPrefix('git'));
  const cleanup = [secrets];
  try {
    const config = path.join(secrets, 'config');
    const header = `Authorization: Basic ${Buffer.from(`x-access-token:${access.token}`).toString('base64')}`;
    const quote = (v: string) => `"${v.replace(/\\/g, '\\\\').replace(/"/g, '\\"')}"`;
    await fs.writeFile(
      config,
      [
        `[http ${quote(`${base}/`)}]`,
        `\textraHeader = ${quote(header)}`,
        // the code host's address was checked, a redirect's never is: none is followed (a renamed repository is named anew)
        '[http]',
        '\tfollowRedirects = false',
        ...(resolve ? [`\tcurloptResolve = ${quote(resolve)}`] : []),
        '[core]',
        '\thooksPath = /dev/null',
        '\tfsmonitor = false',
        '[advice]',
        '\tdetachedHead = false',
        '',
      ].join('\n'),
      { mode: 0o600 },
    );
    const dir = await ctx.checkouts.fresh();
    const gitDir = await fs.mkdtemp(tempPrefix('git-dir'));
    cleanup.push(gitDir);
    const env = {
      ...ctx.childEnv,
      GIT_TERMINAL_PROMPT: '0',
      GIT_CONFIG_NOSYSTEM: '1',
      GIT_CONFIG_GLOBAL: config,
      GIT_DIR: gitDir,
      GIT_WORK_TREE: ctx.sandbox.workspacePath(dir),
      REMOTE: remote,
      REF: ref,
    };
    // a host that echoes what it was sent (its error quoting the Authorization header) gives the token back:
    // what git says is masked as a provider's reason is, streamed a line at a time so a token split between two
    // chunks is masked whole
    const streamed = maskedLines(access.token, (stream, text) => ctx.output(stream, text));
    const r = await runProcess(ctx.sandbox, ['/bin/sh', '-c', CHECKOUT], {
      workspace: dir,
      env,
      network: true,
      binds: [gitDir],
      readOnlyBinds: [secrets],
      signal: ctx.signal,
      maxBytes: CHECKOUT_OUTPUT_MAX,
      onOutput: streamed.write,
    }).finally(streamed.flush);
    const head = r.stdout.trim().split('\n').at(-1) ?? '';
    const output = { repository: repo, ref, remote, head_sha: /^[0-9a-f]{40,64}$/.test(head) ? head : null, connection_id: access.connection_id };
    if (r.aborted) return { output, error: { code: 'aborted', message: 'the checkout was stopped' } };
    if (r.exit_code !== 0)
      return {
        output: { ...output, stderr: maskCredential(r.stderr, access.token) },
        error: { code: 'checkout-failed', message: `git could not fetch ${ref} of ${repo} (exit ${r.exit_code ?? r.signal})` },
      };
    // the ref moved on since the event: what was fetched is not what the event was about
    const expected = typeof args.expect_sha === 'string' && args.expect_sha ? args.expect_sha.toLowerCase() : null;
    if (expected && output.head_sha !== expected)
      return { output, error: { code: 'checkout-moved', message: `${ref} of ${repo} is at ${output.head_sha ?? '?'}, not at ${expected} as the event said` } };
    // the repository joins its files once the token and the network are gone: what is in the folder's `.git` now
    // (another step's making) goes first. In the sandbox, the folder bound by its descriptor: done by path, as the
    // service, a link another run's step put in the folder's place led the removal and the copy into another
    // tenant's repository (or the data dir)
    const joined = await runProcess(
      ctx.sandbox,
      ['/bin/sh', '-c', 'rm -rf "$1/.git" && cp -R "$2" "$1/.git"', 'join', ctx.sandbox.workspacePath(dir), gitDir],
      {
        workspace: dir,
        env: { PATH: ctx.childEnv.PATH ?? '/usr/bin:/bin' },
        network: false,
        readOnlyBinds: [gitDir],
        signal: ctx.signal,
        maxBytes: CHECKOUT_OUTPUT_MAX,
      },
    );
    if (joined.exit_code !== 0)
      return {
        output: { ...output, stderr: maskCredential(joined.stderr, access.token) },
        error: { code: 'checkout-failed', message: `the checkout's git folder could not be put in place (exit ${joined.exit_code ?? joined.signal})` },
      };
    ctx.checkouts.use(dir);
    return { output };
  } finally {
    await Promise.all(cleanup.map((d) => fs.rm(d, { recursive: true, force: true })));
  }
}

export const codehostTool: Tool = {
  ...codehostActions,
  execute: (args, ctx) => (args.action === 'checkout' ? checkout(args, ctx) : codehostActions.execute(args, ctx)),
};

export const chatTool = actionTool('chat', 'Post in chat (Slack), or reply in a thread.', {
  post: { channel: { type: 'string' }, text: { type: 'string' }, thread_ts: { type: 'string', description: 'reply in this thread' } },
  reply: {},
});

export const trackerTool = actionTool('tracker', 'Act on a tracker issue (Linear): add labels, set the priority, comment.', {
  set_labels: { issue_id: { type: 'string' }, labels: { type: 'array', items: { type: 'string' } } },
  set_priority: { priority: { type: 'integer', minimum: 0, maximum: 4, description: '0 none, 1 urgent, 2 high, 3 medium, 4 low' } },
  comment: { body: { type: 'string' } },
});

export const pagerTool = actionTool('pager', 'Act on an incident (PagerDuty): add a note, acknowledge it.', {
  add_note: { incident_id: { type: 'string' }, content: { type: 'string' } },
  acknowledge: {},
});

export const emailTool = actionTool('email', 'Send an email through the SMTP connection: a reply to a sender.', {
  reply: {
    to: { type: 'string' },
    subject: { type: 'string' },
    text: { type: 'string' },
    in_reply_to: { type: 'string', description: 'the Message-ID answered' },
    references: { type: 'string' },
  },
});

export const PROVIDER_TOOLS = [codehostTool, chatTool, trackerTool, pagerTool, emailTool];

/** The longest piece of a line held back for its end; a line longer than it goes out masked as it is. */
const MASKED_LINE_MAX = 16 * 1024;

/**
 * Output streamed with the credential masked, a line (or a progress line ending in a carriage return) at a
 * time, so that a token split between two chunks is masked whole; `flush` sends what is left once the process
 * has ended.
 */
function maskedLines(secret: string, out: (stream: 'stdout' | 'stderr', text: string) => void) {
  const held = { stdout: '', stderr: '' };
  return {
    write(stream: 'stdout' | 'stderr', text: string): void {
      const all = held[stream] + text;
      const end = Math.max(all.lastIndexOf('\n'), all.lastIndexOf('\r')) + 1;
      const cut = end > 0 ? end : all.length > MASKED_LINE_MAX ? all.length : 0;
      held[stream] = all.slice(cut);
      if (cut) out(stream, maskCredential(all.slice(0, cut), secret));
    },
    flush(): void {
      for (const stream of ['stdout', 'stderr'] as const) {
        if (held[stream]) out(stream, maskCredential(held[stream], secret));
        held[stream] = '';
      }
    },
  };
}
