// Fake providers on loopback for the connection tests: one HTTP server answering as GitHub's REST API
// (/github), Slack's Web API (/slack/api), Linear's GraphQL API (/linear/graphql) and PagerDuty's REST
// API (/pager), plus an smtp-server. Each SDK is pointed at its part by its base URL option. They check
// the credential the way each provider does, answer with the shapes each SDK reads, and record every
// request (and every mail) for the test to look at.
import { execFileSync } from 'node:child_process';
import { createHash, createVerify, randomBytes, type KeyObject } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { SMTPServer } from 'smtp-server';

export type Recorded = {
  provider: 'github' | 'slack' | 'linear' | 'pager';
  method: string;
  path: string;
  authorization: string;
  headers: http.IncomingHttpHeaders;
  body: any;
  /** when it came (Date.now()) */
  at: number;
};
export type Mail = { from: string; to: string[]; data: string };

export type FakeProviders = {
  github: string;
  slack: string;
  linear: string;
  pager: string;
  smtp: string;
  requests: Recorded[];
  mails: Mail[];
  /** serves a bare repository as owner/name over git's dumb HTTP protocol, under the code host's address, to the token only */
  serveRepo(repository: string, bareDir: string): void;
  /** answers the git requests of one repository with a redirect to another's (a renamed repository, or a host sending git elsewhere) */
  redirectRepo(from: string, to: string): void;
  /** answers the git requests of one repository with a smart-HTTP error that quotes the request's Authorization, decoded and not */
  echoAuthRepo(repository: string): void;
  /** the files of main's one commit, for the Git Data API (a pull request from a diff): text, or bytes */
  setFiles(repository: string, files: Record<string, string | Buffer>): void;
  /**
   * the next `times` requests to a provider answer `status` (with Retry-After when given, and any other `headers`);
   * with `at` (`POST /github/repos/acme/app/pulls`), only the requests of that method and path
   */
  failNext(provider: Recorded['provider'], status: number, times?: number, retryAfter?: number, headers?: Record<string, string>, at?: string): void;
  /** Slack answers with the Authorization it was sent in its names, ids and scopes (a compatible server that echoes), the code host in its URLs, or no longer */
  echoCredential(on: boolean): void;
  /** the installation tokens the GitHub App (opts.app) was given, in the order they were made */
  appTokens: string[];
  /** the folders whose trees were listed (the root as ''), in order */
  treesListed: string[];
  /** a file's content is answered `delayMs` late (0: at once); the most such answers awaited at once */
  contents: { delayMs: number; inFlight: number; mostAtOnce: number };
  close(): Promise<void>;
};

export const FAKE_TOKEN = 'fake-token-0123456789abcdefghij';
export const SMTP_USER = 'bot@acme.test';
/** the labels the fake tracker has */
export const LINEAR_LABELS = [
  { id: 'label-bug', name: 'bug' },
  { id: 'label-p1', name: 'needs-triage' },
  { id: 'label-ui', name: 'ui' },
];

/** The name git gives a blob of these bytes. */
export const gitBlobSha = (bytes: Buffer): string =>
  createHash('sha1')
    .update(Buffer.concat([Buffer.from(`blob ${bytes.length}\0`), bytes]))
    .digest('hex');

function readBody(req: http.IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

/** A GitHub App the fake code host knows: its id, an installation of it, and the public key its JWTs are checked with. */
export type FakeApp = { id: string; installationId: string; publicKey: KeyObject };

/** The claims of a JWT signed RS256 with the key, as GitHub checks an App's; null when it is not one. */
function appClaims(jwt: string, publicKey: KeyObject): { iss?: unknown; iat?: number; exp?: number } | null {
  const [head, body, signature] = jwt.split('.');
  if (!head || !body || !signature) return null;
  try {
    if (JSON.parse(Buffer.from(head, 'base64url').toString()).alg !== 'RS256') return null;
  } catch {
    return null;
  }
  const verified = createVerify('RSA-SHA256').update(`${head}.${body}`).verify(publicKey, Buffer.from(signature, 'base64url'));
  return verified ? JSON.parse(Buffer.from(body, 'base64url').toString()) : null;
}

export async function startFakeProviders(opts: { token?: string; app?: FakeApp } = {}): Promise<FakeProviders> {
  const token = opts.token ?? FAKE_TOKEN;
  /** installation tokens made for opts.app: they act as the token does, except where GitHub refuses an installation */
  const appTokens: string[] = [];
  const treesListed: string[] = [];
  const contents = { delayMs: 0, inFlight: 0, mostAtOnce: 0 };
  const tokenOk = (t: string) => t === token || appTokens.includes(t);
  const requests: Recorded[] = [];
  const mails: Mail[] = [];
  const failures = new Map<string, { status: number; times: number; retryAfter?: number; headers?: Record<string, string>; at?: string }>();
  let echoing = false;
  let nextId = 1000;

  const json = (res: http.ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}) => {
    res.writeHead(status, { 'content-type': 'application/json', ...headers });
    res.end(JSON.stringify(body));
  };

  const repos = new Map<string, string>();
  const redirects = new Map<string, string>();
  const echoingRepos = new Set<string>();
  const repoFiles = new Map<string, Record<string, string | Buffer>>();
  /** what the Git Data API made: branches (repository and ref: a commit), commits (their tree and parents) */
  const refs = new Map<string, string>();
  const commits = new Map<string, { tree: string; parents: string[] }>();

  function github(r: Recorded, res: http.ServerResponse): void {
    const git = /^\/github\/([\w.-]+\/[\w.-]+)\.git\/(.+)$/.exec(r.path);
    if (git) {
      const moved = redirects.get(git[1]!);
      if (moved) return void res.writeHead(301, { location: `/github/${moved}.git/${git[2]}` }).end();
      if (echoingRepos.has(git[1]!)) {
        const basic = r.authorization?.replace(/^Basic /, '') ?? '';
        const line = `ERR access denied for ${Buffer.from(basic, 'base64').toString()} (${basic})\n`;
        res.writeHead(200, { 'content-type': 'application/x-git-upload-pack-advertisement' });
        return void res.end(`${(line.length + 4).toString(16).padStart(4, '0')}${line}`);
      }
      const dir = repos.get(git[1]!);
      const basicToken = /^Basic (.+)$/.exec(r.authorization)?.[1];
      const gitUser = basicToken ? Buffer.from(basicToken, 'base64').toString() : '';
      if (!gitUser.startsWith('x-access-token:') || !tokenOk(gitUser.slice('x-access-token:'.length))) {
        res.writeHead(401, { 'www-authenticate': 'Basic realm="git"' });
        return void res.end();
      }
      const file = dir && path.resolve(dir, git[2]!);
      if (!file || !file.startsWith(dir + path.sep) || !fs.existsSync(file) || !fs.statSync(file).isFile()) return void res.writeHead(404).end();
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      return void res.end(fs.readFileSync(file));
    }
    const p = r.path.replace(/^\/github/, '');
    // an App's installation token, for a JWT the App signed (iss its id, an expiry within ten minutes)
    const minting = /^\/app\/installations\/(\d+)\/access_tokens$/.exec(p);
    if (minting && r.method === 'POST') {
      const claims = opts.app && appClaims(r.authorization.replace(/^bearer /i, ''), opts.app.publicKey);
      const now = Math.floor(Date.now() / 1000);
      if (!claims || String(claims.iss) !== opts.app!.id || !claims.exp || claims.exp < now || claims.exp - now > 600)
        return json(res, 401, { message: 'A JSON web token could not be decoded' });
      if (minting[1] !== opts.app!.installationId) return json(res, 404, { message: 'Not Found' });
      const made = `ghs_${randomBytes(18).toString('hex')}`;
      appTokens.push(made);
      return json(res, 201, {
        token: made,
        expires_at: new Date(Date.now() + 3_600_000).toISOString(),
        permissions: { checks: 'write', contents: 'read', pull_requests: 'write' },
        repository_selection: 'all',
      });
    }
    const presented = /^(?:token|Bearer) (.+)$/.exec(r.authorization)?.[1] ?? '';
    if (!tokenOk(presented)) return json(res, 401, { message: 'Bad credentials' });
    const installation = appTokens.includes(presented);
    if (r.method === 'GET' && p === '/user')
      return installation
        ? json(res, 403, { message: 'Resource not accessible by integration' })
        : json(res, 200, { login: 'acme-bot', id: 1 }, { 'x-oauth-scopes': 'repo, workflow' });
    if (r.method === 'GET' && p.startsWith('/installation/repositories'))
      return installation
        ? json(res, 200, { total_count: 2, repositories: [{ full_name: 'acme/app' }, { full_name: 'acme/lib' }] })
        : json(res, 403, { message: 'You must authenticate with an installation access token' });
    // the Git Data API over files a test set: one base commit of main
    const data = /^\/repos\/([\w.-]+\/[\w.-]+)\/(git\/ref\/heads\/main|git\/commits\/base-commit|git\/trees\/(base-tree|t-[0-9a-f]+)|contents\/(.+))$/.exec(p);
    const files = data && repoFiles.get(data[1]!);
    if (r.method === 'GET' && data && files) {
      if (data[2] === 'git/ref/heads/main') return json(res, 200, { ref: 'refs/heads/main', object: { type: 'commit', sha: 'base-commit' } });
      if (data[2] === 'git/commits/base-commit') return json(res, 200, { sha: 'base-commit', tree: { sha: 'base-tree' } });
      if (data[3]) {
        // a folder's own entries, as GitHub lists a tree (not recursive): its files, and its folders as trees (sha t-<hex of the path>)
        const dir = data[3] === 'base-tree' ? '' : Buffer.from(data[3].slice(2), 'hex').toString();
        treesListed.push(dir);
        const inside = Object.keys(files)
          .filter((f) => (dir ? f.startsWith(`${dir}/`) : true))
          .map((f) => (dir ? f.slice(dir.length + 1) : f));
        const entries = new Map<string, object>();
        for (const rest of inside) {
          const [name, ...deeper] = rest.split('/');
          const full = dir ? `${dir}/${name}` : name!;
          entries.set(
            name!,
            deeper.length
              ? { path: name, mode: '040000', type: 'tree', sha: `t-${Buffer.from(full).toString('hex')}` }
              : { path: name, mode: full.endsWith('.sh') ? '100755' : '100644', type: 'blob', sha: 'blob' },
          );
        }
        return json(res, 200, { sha: data[3], truncated: false, tree: [...entries.values()] });
      }
      const content = files[decodeURIComponent(data[4]!)];
      if (content === undefined) return json(res, 404, { message: 'Not Found' });
      const answer = () => json(res, 200, { type: 'file', encoding: 'base64', content: Buffer.from(content).toString('base64'), sha: 'blob' });
      if (!contents.delayMs) return answer();
      contents.inFlight++;
      contents.mostAtOnce = Math.max(contents.mostAtOnce, contents.inFlight);
      return void setTimeout(() => (contents.inFlight--, answer()), contents.delayMs);
    }
    // trees by their content, as git names them; branches made once; commits and branches read back
    const made = /^\/repos\/([\w.-]+\/[\w.-]+)\/git\/(blobs|trees|commits|refs|ref\/heads\/(.+)|commits\/(.+))$/.exec(p);
    const sent = (typeof r.body === 'object' && r.body ? r.body : {}) as {
      base_tree?: string;
      tree?: unknown;
      ref?: string;
      sha?: string;
      parents?: string[];
      content?: string;
      encoding?: string;
    };
    // a blob named as git names it: by its bytes, given as UTF-8 text or base64
    if (made && r.method === 'POST' && made[2] === 'blobs') {
      const bytes = Buffer.from(String(sent.content ?? ''), sent.encoding === 'base64' ? 'base64' : 'utf8');
      return json(res, 201, { sha: gitBlobSha(bytes), url: `${p}/${gitBlobSha(bytes)}` });
    }
    if (made && r.method === 'POST' && made[2] === 'trees')
      return json(res, 201, {
        sha: `tree-${createHash('sha256')
          .update(JSON.stringify([sent.base_tree, sent.tree]))
          .digest('hex')
          .slice(0, 12)}`,
      });
    if (made && r.method === 'POST' && made[2] === 'refs') {
      const key = `${made[1]} ${sent.ref}`;
      if (refs.has(key)) return json(res, 422, { message: 'Reference already exists' });
      refs.set(key, String(sent.sha));
      return json(res, 201, { ref: sent.ref, object: { type: 'commit', sha: sent.sha } });
    }
    if (made && r.method === 'GET' && made[3] !== undefined) {
      const sha = refs.get(`${made[1]} refs/heads/${made[3]}`);
      return sha ? json(res, 200, { ref: `refs/heads/${made[3]}`, object: { type: 'commit', sha } }) : json(res, 404, { message: 'Not Found' });
    }
    if (made && r.method === 'GET' && made[4] !== undefined && commits.has(made[4])) {
      const c = commits.get(made[4])!;
      return json(res, 200, { sha: made[4], tree: { sha: c.tree }, parents: c.parents.map((sha) => ({ sha })) });
    }
    const id = nextId++;
    if (made && r.method === 'POST' && made[2] === 'commits') commits.set(`sha-${id}`, { tree: String(sent.tree), parents: sent.parents ?? [] });
    return json(res, r.method === 'POST' ? 201 : 200, {
      id,
      sha: `sha-${id}`,
      // a compatible server that echoes (echoCredential) puts what it was sent in the URL it answers
      html_url: `https://github.example/${p.slice(1)}#${id}${echoing ? ` ${r.authorization}` : ''}`,
      number: id,
      ...(typeof r.body === 'object' ? r.body : {}),
    });
  }

  function slack(r: Recorded, res: http.ServerResponse): void {
    const method = r.path.replace(/^\/slack\/api\//, '');
    if (r.authorization !== `Bearer ${token}`) return json(res, 200, { ok: false, error: 'invalid_auth' });
    if (echoing && method === 'auth.test')
      return json(res, 200, { ok: true, user: r.authorization, team: token, user_id: token, team_id: 'T1' }, { 'x-oauth-scopes': `chat:write,${token}` });
    if (echoing && method === 'chat.postMessage') return json(res, 200, { ok: true, channel: r.authorization, ts: token, message: { text: token } });
    if (method === 'auth.test')
      return json(res, 200, { ok: true, user: 'acme-bot', team: 'Acme', user_id: 'U1', team_id: 'T1' }, { 'x-oauth-scopes': 'chat:write,app_mentions:read' });
    if (method === 'chat.postMessage') return json(res, 200, { ok: true, channel: r.body.channel, ts: `${Date.now() / 1000}`, message: { text: r.body.text } });
    return json(res, 200, { ok: false, error: 'unknown_method' });
  }

  function linear(r: Recorded, res: http.ServerResponse): void {
    if (r.authorization !== token)
      return json(res, 400, {
        errors: [{ message: 'Authentication required, not authenticated', extensions: { type: 'authentication error', code: 'AUTHENTICATION_ERROR' } }],
      });
    const query = String(r.body?.query ?? '');
    if (/\bviewer\b/.test(query))
      return json(res, 200, { data: { viewer: { id: 'user-1', name: 'Acme Bot', email: 'bot@acme.test', active: true, admin: false, guest: false } } });
    const vars = r.body?.variables ?? {};
    if (/\bissueLabels\b/.test(query)) {
      const wanted: string[] = vars.filter?.name?.in ?? [];
      const nodes = LINEAR_LABELS.filter((l) => wanted.some((w) => w.toLowerCase() === l.name.toLowerCase()));
      return json(res, 200, { data: { issueLabels: { nodes, pageInfo: { hasNextPage: false, hasPreviousPage: false, startCursor: null, endCursor: null } } } });
    }
    if (/\bissueUpdate\b/.test(query)) return json(res, 200, { data: { issueUpdate: { success: true, lastSyncId: 1, issue: { id: vars.id } } } });
    if (/\bcommentCreate\b/.test(query))
      return json(res, 200, { data: { commentCreate: { success: true, lastSyncId: 2, comment: { id: `comment-${nextId++}` } } } });
    return json(res, 200, { errors: [{ message: 'unknown operation', extensions: { type: 'invalid input' } }] });
  }

  function pager(r: Recorded, res: http.ServerResponse): void {
    if (r.authorization !== `Token token=${token}`) return json(res, 401, { error: { message: 'Unauthorized', code: 2006 } });
    const p = r.path.replace(/^\/pager/, '');
    if (r.method === 'GET' && p === '/abilities') return json(res, 200, { abilities: ['teams', 'urgencies', 'read_only_users'] });
    if (!r.headers.from) return json(res, 400, { error: { message: 'You must specify a user in the From header', code: 2001 } });
    const note = /^\/incidents\/([^/]+)\/notes$/.exec(p);
    if (r.method === 'POST' && note) return json(res, 201, { note: { id: `note-${nextId++}`, content: r.body?.note?.content } });
    const incident = /^\/incidents\/([^/]+)$/.exec(p);
    if (r.method === 'PUT' && incident) return json(res, 200, { incident: { id: incident[1], status: r.body?.incident?.status } });
    return json(res, 404, { error: { message: 'Not Found', code: 2100 } });
  }

  const server = http.createServer((req, res) => {
    void (async () => {
      const url = new URL(req.url ?? '/', 'http://x');
      // Octokit sends a path parameter's slashes encoded (heads%2Fmain), as GitHub takes them
      url.pathname = decodeURIComponent(url.pathname);
      const text = await readBody(req);
      let body: any = text;
      const type = String(req.headers['content-type'] ?? '');
      if (type.includes('json') && text) body = JSON.parse(text);
      else if (type.includes('x-www-form-urlencoded')) body = Object.fromEntries(new URLSearchParams(text));
      const provider = url.pathname.split('/')[1] as Recorded['provider'];
      const r: Recorded = {
        provider,
        method: req.method ?? 'GET',
        path: url.pathname,
        authorization: String(req.headers.authorization ?? ''),
        headers: req.headers,
        body,
        at: Date.now(),
      };
      requests.push(r);
      const failing = failures.get(provider);
      if (failing && failing.times > 0 && (!failing.at || failing.at === `${r.method} ${r.path}`)) {
        failing.times--;
        return json(
          res,
          failing.status,
          { message: 'failing on purpose' },
          { ...(failing.retryAfter !== undefined ? { 'retry-after': String(failing.retryAfter) } : {}), ...failing.headers },
        );
      }
      if (provider === 'github') return github(r, res);
      if (provider === 'slack') return slack(r, res);
      if (provider === 'linear') return linear(r, res);
      if (provider === 'pager') return pager(r, res);
      json(res, 404, { message: 'Not Found' });
    })().catch((err: Error) => json(res, 500, { message: err.message }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;

  const smtp = new SMTPServer({
    disabledCommands: ['STARTTLS'],
    allowInsecureAuth: true,
    authMethods: ['PLAIN', 'LOGIN'],
    logger: false,
    onAuth(auth, _session, callback) {
      if (auth.username === SMTP_USER && auth.password === token) return callback(null, { user: auth.username });
      callback(new Error('Invalid username or password'));
    },
    onData(stream, session, callback) {
      const chunks: Buffer[] = [];
      stream.on('data', (c: Buffer) => chunks.push(c));
      stream.on('end', () => {
        mails.push({
          from: session.envelope.mailFrom ? session.envelope.mailFrom.address : '',
          to: session.envelope.rcptTo.map((t) => t.address),
          data: Buffer.concat(chunks).toString('utf8'),
        });
        callback();
      });
    },
  });
  await new Promise<void>((resolve) => smtp.listen(0, '127.0.0.1', resolve));
  const smtpPort = (smtp.server.address() as AddressInfo).port;

  return {
    github: `${base}/github`,
    slack: `${base}/slack/api/`,
    linear: `${base}/linear/graphql`,
    pager: `${base}/pager`,
    smtp: `smtp://127.0.0.1:${smtpPort}`,
    requests,
    mails,
    setFiles(repository, files) {
      repoFiles.set(repository, files);
    },
    serveRepo(repository, bareDir) {
      repos.set(repository, path.resolve(bareDir));
    },
    redirectRepo(from, to) {
      redirects.set(from, to);
    },
    echoAuthRepo(repository) {
      echoingRepos.add(repository);
    },
    failNext(provider, status, times = 1, retryAfter, headers, at) {
      failures.set(provider, { status, times, retryAfter, headers, at });
    },
    appTokens,
    treesListed,
    contents,
    echoCredential(on) {
      echoing = on;
    },
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await new Promise<void>((resolve) => smtp.close(() => resolve()));
    },
  };
}

/**
 * A bare repository for the fake code host: a main branch, and a pull request's head (refs/pull/<n>/head)
 * one commit after it that changes `file`. Returns the directory and the head's sha.
 */
export function makePullRequestRepo(root: string, n: number, file: { path: string; content: string }): { bare: string; head: string } {
  const work = path.join(root, 'pr-src');
  const bare = path.join(root, 'pr.git');
  fs.mkdirSync(work, { recursive: true });
  const git = (cwd: string, ...args: string[]) =>
    execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', ...args], { cwd })
      .toString()
      .trim();
  git(work, 'init', '-q', '-b', 'main');
  fs.writeFileSync(path.join(work, 'README.md'), '# app\n');
  git(work, 'add', '-A');
  git(work, 'commit', '-qm', 'init');
  fs.mkdirSync(path.dirname(path.join(work, file.path)), { recursive: true });
  fs.writeFileSync(path.join(work, file.path), file.content);
  git(work, 'add', '-A');
  git(work, 'commit', '-qm', `pull request ${n}`);
  const head = git(work, 'rev-parse', 'HEAD');
  git(root, 'clone', '-q', '--bare', work, bare);
  git(bare, 'update-ref', `refs/pull/${n}/head`, head);
  git(bare, 'update-ref', 'refs/heads/main', `${head}~1`);
  git(bare, 'update-server-info');
  return { bare, head };
}
