// What the action tools do on each provider, through its SDK: a code host review, comment and check
// runs; a chat post or threaded reply; tracker labels, priority and comments; a pager note or
// acknowledgement; an email reply. Each answers what the provider gave back (ids, URLs), never the
// credential. Arguments are checked here, before anything is sent.
import { isUtf8 } from 'node:buffer';
import path from 'node:path';
import { applyPatch, parsePatch } from 'diff';
import { applyBinaryPatch, BinaryPatchError, gitBlobName, limited, type ConnectionProvider } from '../platform/index.js';
import { linearOf, mailerOf, octokitOf, pagerCall, slackOf, untilAborted, type Access } from './kits.js';

type Args = Record<string, unknown>;
export type Answer = Record<string, unknown>;

/** Arguments an action cannot take: nothing was sent. */
export class ActionArgsError extends Error {
  readonly code = 'invalid-args';
}

function str(args: Args, name: string): string {
  const v = args[name];
  if (typeof v === 'string' && v.trim()) return v;
  throw new ActionArgsError(`args.${name} must be a non-empty string`);
}
/** An optional string: absent, null or empty is absent (an interpolated reference to nothing is empty). */
const optStr = (args: Args, name: string): string | undefined =>
  args[name] === undefined || args[name] === null || args[name] === '' ? undefined : str(args, name);
function int(args: Args, name: string, min = 1, max = Number.MAX_SAFE_INTEGER): number {
  const v = typeof args[name] === 'string' && /^\d+$/.test(args[name]) ? Number(args[name]) : args[name];
  if (typeof v === 'number' && Number.isInteger(v) && v >= min && v <= max) return v;
  throw new ActionArgsError(`args.${name} must be an integer from ${min}${max < Number.MAX_SAFE_INTEGER ? ` to ${max}` : ''}`);
}
function repoOf(args: Args): { owner: string; repo: string } {
  const m = /^([\w.-]+)\/([\w.-]+)$/.exec(str(args, 'repository'));
  if (!m) throw new ActionArgsError('args.repository must be owner/name');
  return { owner: m[1]!, repo: m[2]! };
}
function list<T>(args: Args, name: string, each: (v: unknown, i: number) => T, max = 100): T[] {
  const v = args[name];
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v) || v.length > max) throw new ActionArgsError(`args.${name} must be a list of at most ${max}`);
  return v.map(each);
}

const REVIEW_EVENTS = ['COMMENT', 'APPROVE', 'REQUEST_CHANGES'] as const;
const CHECK_CONCLUSIONS = ['success', 'failure', 'neutral', 'cancelled', 'skipped', 'timed_out', 'action_required'] as const;
const ANNOTATION_LEVELS = ['notice', 'warning', 'failure'] as const;

function oneOf<T extends string>(value: unknown, allowed: readonly T[], name: string): T {
  if (typeof value === 'string' && (allowed as readonly string[]).includes(value)) return value as T;
  throw new ActionArgsError(`args.${name} must be one of ${allowed.join(', ')}`);
}

/** A check run's output: title, summary and at most 50 annotations (GitHub's limit per request). */
function checkOutput(args: Args) {
  const output = args.output as Args | undefined;
  if (output === undefined) return undefined;
  if (!output || typeof output !== 'object') throw new ActionArgsError('args.output must be an object');
  return {
    title: str(output, 'title'),
    summary: str(output, 'summary').slice(0, 65_535),
    annotations: list(
      output,
      'annotations',
      (a, i) => {
        const x = a as Args;
        if (!x || typeof x !== 'object') throw new ActionArgsError(`args.output.annotations[${i}] must be an object`);
        const start = int(x, 'start_line');
        return {
          path: str(x, 'path'),
          start_line: start,
          end_line: x.end_line === undefined ? start : int(x, 'end_line'),
          annotation_level: oneOf(x.annotation_level ?? 'failure', ANNOTATION_LEVELS, `output.annotations[${i}].annotation_level`),
          message: str(x, 'message').slice(0, 64 * 1024),
          ...(x.title ? { title: str(x, 'title') } : {}),
        };
      },
      50,
    ),
  };
}

/** What an action may read besides the provider: a vibe run of the same tenant, for its diff. */
export type ActionContext = { vibeDiff(runId: string): Promise<string> };

/** A check run that names its conclusion is completed now; null when it names none. */
function completion(args: Args) {
  if (args.conclusion === undefined) return null;
  return { status: 'completed' as const, conclusion: oneOf(args.conclusion, CHECK_CONCLUSIONS, 'conclusion'), completed_at: new Date().toISOString() };
}

/**
 * One action, and whether it lands the same however often it is made (`idempotent`: a label added, a priority set,
 * an acknowledgement, a check run updated). One that is not makes something each time it is called (a comment, a
 * message, a note, an email): after a 5xx or a timeout it may have been made all the same, so it is asked again
 * only when the provider said it did nothing (retry.ts).
 */
export type Action = ((access: Access, args: Args, ctx: ActionContext) => Promise<Answer>) & { readonly idempotent: boolean };

type Run = (access: Access, args: Args, ctx: ActionContext) => Promise<Answer>;
/** An action that makes something each time it is called. */
const once = (run: Run): Action => Object.assign(run, { idempotent: false });
/** An action that lands the same however often it is made. */
const repeatable = (run: Run): Action => Object.assign(run, { idempotent: true });

const BRANCH = /^(?!-)(?!.*\.\.)[\w./-]{1,200}$/;
/** a path of a git diff header (a/x, b/x), or null for /dev/null */
const diffPath = (name: string | undefined): string | null => (!name || name === '/dev/null' ? null : name.replace(/^[ab]\//, ''));

type Octokit = Awaited<ReturnType<typeof octokitOf>>;

/**
 * A file's bytes at a commit: the contents API gives them in base64 up to 1 MB, the blob API beyond (as far as an
 * answer is read: 4 MB, some 3 MB of a file in base64; a larger base fails as an answer over the bound).
 */
async function baseBytes(gh: Octokit, owner: string, repo: string, file: string, ref: string): Promise<Buffer> {
  const got = (await gh.rest.repos.getContent({ owner, repo, path: file, ref })).data as { content?: string; encoding?: string; sha?: string };
  if (got.encoding === 'base64') return Buffer.from(got.content ?? '', 'base64');
  if (got.encoding === 'none' && got.sha) return Buffer.from((await gh.rest.git.getBlob({ owner, repo, file_sha: got.sha })).data.content, 'base64');
  return Buffer.from(got.content ?? '', 'utf8');
}

/** How many base files a pull request reads at once. */
const BASE_READS_AT_ONCE = 8;

/** A blob of exactly these bytes, made from them in base64; its name. */
const blobOf = async (gh: Octokit, owner: string, repo: string, bytes: Buffer): Promise<string> =>
  (await gh.rest.git.createBlob({ owner, repo, content: bytes.toString('base64'), encoding: 'base64' })).data.sha;

/**
 * The most a pull request's binary files may hold together once applied: a diff within its 1 MB may deflate to
 * 100 MB a file, each held as bytes and as base64 while its blob is made.
 */
const PR_BINARY_MAX_BYTES = 64 * 1024 * 1024;

/** Whether `bytes` are the blob a diff's `index` line names (all zeros: none, a file made or deleted). */
const sameBlob = (bytes: Buffer, name: string): boolean => (/^0+$/.test(name) ? bytes.length === 0 : gitBlobName(bytes, name.length) === name);

export const ACTIONS: Record<ConnectionProvider, Record<string, Action>> = {
  codehost: {
    comment: once(async (a, args) => {
      const gh = await octokitOf(a);
      const res = await gh.rest.issues.createComment({ ...repoOf(args), issue_number: int(args, 'number'), body: str(args, 'body') });
      return { comment_id: res.data.id, url: res.data.html_url };
    }),
    review: once(async (a, args) => {
      const gh = await octokitOf(a);
      const comments = list(args, 'comments', (c, i) => {
        const x = c as Args;
        if (!x || typeof x !== 'object') throw new ActionArgsError(`args.comments[${i}] must be an object`);
        return { path: str(x, 'path'), line: int(x, 'line'), side: x.side === 'LEFT' ? ('LEFT' as const) : ('RIGHT' as const), body: str(x, 'body') };
      });
      const res = await gh.rest.pulls.createReview({
        ...repoOf(args),
        pull_number: int(args, 'number'),
        body: str(args, 'body'),
        event: oneOf(args.event ?? 'COMMENT', REVIEW_EVENTS, 'event'),
        ...(optStr(args, 'commit_id') ? { commit_id: optStr(args, 'commit_id') } : {}),
        comments,
      });
      return { review_id: res.data.id, url: res.data.html_url, comments: comments.length };
    }),
    create_check_run: once(async (a, args) => {
      const gh = await octokitOf(a);
      const res = await gh.rest.checks.create({
        ...repoOf(args),
        name: str(args, 'name'),
        head_sha: str(args, 'head_sha'),
        ...(completion(args) ?? { status: 'in_progress' as const }),
        ...(checkOutput(args) ? { output: checkOutput(args) } : {}),
        ...(optStr(args, 'details_url') ? { details_url: optStr(args, 'details_url') } : {}),
      });
      return { check_run_id: res.data.id, url: res.data.html_url };
    }),
    /**
     * A pull request from a vibe run's diff, made with the Git Data API: each changed file's content at
     * the base is patched, the new tree committed on the base, a branch made for it, the pull request opened.
     * A file that is not UTF-8 text (a binary patch in the diff) is read and written as bytes: its blob is made
     * from them in base64, never from text, which would replace what is not UTF-8 (U+FFFD).
     */
    open_pull_request: once(async (a, args, ctx) => {
      const { owner, repo } = repoOf(args);
      const base = optStr(args, 'base') ?? 'main';
      const head = str(args, 'head');
      const title = str(args, 'title');
      if (!BRANCH.test(head) || !BRANCH.test(base)) throw new ActionArgsError('args.head and args.base must be branch names');
      // each file's part of the diff (from its `diff --git` line to the next): a binary patch in one is read from it
      // whole, as parsePatch reads its header only
      const parts = (await ctx.vibeDiff(str(args, 'run_id'))).split(/^(?=diff --git )/m).filter((part) => part.trim());
      const patches = parts.flatMap((part) => parsePatch(part).map((p) => ({ p, part })));
      if (!patches.length) throw new ActionArgsError('the run changed nothing: there is no pull request to open');
      const gh = await octokitOf(a);
      const baseSha = (await gh.rest.git.getRef({ owner, repo, ref: `heads/${base}` })).data.object.sha;
      const baseTree = (await gh.rest.git.getCommit({ owner, repo, commit_sha: baseSha })).data.tree.sha;
      // the base's modes, so that a changed script stays executable and a link stays a link: read folder by folder,
      // only those of the changed files (the whole tree at once was past the 4 MB an answer may be from 20,000 files)
      const folders = new Map<string, Promise<Map<string, { mode?: string; type?: string; sha?: string }> | null>>();
      const folder = (dir: string): Promise<Map<string, { mode?: string; type?: string; sha?: string }> | null> => {
        let listed = folders.get(dir);
        if (!listed) {
          listed = (async () => {
            let sha: string | undefined = baseTree;
            if (dir !== '.') {
              const entry = (await folder(path.posix.dirname(dir)))?.get(path.posix.basename(dir));
              if (entry?.type !== 'tree') return null;
              sha = entry.sha;
            }
            const entries = (await gh.rest.git.getTree({ owner, repo, tree_sha: sha! })).data.tree;
            return new Map(entries.map((e) => [e.path!, e]));
          })();
          folders.set(dir, listed);
        }
        return listed;
      };
      const baseModeOf = async (file: string) => (await folder(path.posix.dirname(file)))?.get(path.posix.basename(file))?.mode;
      type Entry = { path: string; mode: '100644' | '100755' | '120000'; type: 'blob'; content?: string; sha?: string | null };
      const tree: Entry[] = [];
      let binaryBytes = 0;
      // the files the patches start from, read a few at once: one after another, 300 files at 100 ms each were past
      // the 30 s the whole action is held to (each is awaited below, in the diff's order)
      const reads = limited(BASE_READS_AT_ONCE);
      const froms = new Set(patches.flatMap(({ p }) => (p.isCreate || p.isDelete ? [] : [diffPath(p.oldFileName)].filter((f) => f !== null))));
      const sources = new Map([...froms].map((file) => [file, reads(() => baseBytes(gh, owner, repo, file, baseSha))] as const));
      // one not awaited (the action failed before it) is no unhandled rejection
      for (const read of sources.values()) read.catch(() => undefined);
      for (const { p, part } of patches) {
        // a file made or deleted has no side before or after (git names both paths in its header when it is empty)
        const from = p.isCreate ? null : diffPath(p.oldFileName);
        const to = p.isDelete ? null : diffPath(p.newFileName);
        const binary = /^GIT binary patch$/m.test(part);
        // a binary change without git's binary patch (`Binary files … differ`) has not the bytes: refused rather than
        // guessed. Without a hunk otherwise: an empty file made, a file renamed as it was, a change of mode alone (the
        // content is the base's, or none)
        const bare = !binary && p.hunks.length === 0 && !p.isCreate && !p.isDelete && !p.isRename && !p.newMode;
        if (p.isBinary || (to !== null && from !== null && bare))
          throw new ActionArgsError(`the run's change to ${to ?? from} is binary and its diff does not hold its bytes: it cannot be opened as a pull request`);
        const baseMode = from !== null ? await baseModeOf(from) : undefined;
        if (baseMode === '120000' || baseMode === '160000') throw new ActionArgsError(`${from} is a link or a submodule: it cannot be patched`);
        // the mode the run gave it (a script made executable), else the base's
        if (p.newMode && p.newMode !== '100644' && p.newMode !== '100755')
          throw new ActionArgsError(`the run made ${to} a link or a submodule (mode ${p.newMode}): it cannot be opened as a pull request from its diff`);
        const mode = (p.newMode ?? baseMode ?? '100644') as Entry['mode'];
        if (to === null) {
          if (from) tree.push({ path: from, mode: '100644', type: 'blob', sha: null });
          continue;
        }
        const source = from !== null ? await sources.get(from)! : Buffer.alloc(0);
        const refused = () => new ActionArgsError(`the run's change to ${to} does not apply to ${base} at ${baseSha.slice(0, 7)}`);
        if (binary) {
          // checked as git apply checks a binary patch: the base is the blob it was taken against, and so is the result
          const names = /^index ([0-9a-f]+)\.\.([0-9a-f]+)/m.exec(part);
          if (!names || !sameBlob(source, names[1]!)) throw refused();
          let bytes: Buffer | null;
          try {
            bytes = applyBinaryPatch(part, source);
          } catch (err) {
            if (err instanceof BinaryPatchError) throw refused();
            throw err;
          }
          if (!bytes || !sameBlob(bytes, names[2]!)) throw refused();
          binaryBytes += bytes.length;
          if (binaryBytes > PR_BINARY_MAX_BYTES)
            throw new ActionArgsError(
              `the run's binary files hold over ${PR_BINARY_MAX_BYTES / 1024 / 1024} MB together: more than a pull request made from its diff may carry`,
            );
          tree.push({ path: to, mode, type: 'blob', sha: await blobOf(gh, owner, repo, bytes) });
        } else if (p.hunks.length) {
          // a text patch is of UTF-8 text (the run's diff gives any other file as a binary patch)
          const patched = isUtf8(source) ? applyPatch(source.toString('utf8'), p) : false;
          if (patched === false) throw refused();
          tree.push({ path: to, mode, type: 'blob', content: patched });
        } else if (isUtf8(source)) tree.push({ path: to, mode, type: 'blob', content: source.toString('utf8') });
        else tree.push({ path: to, mode, type: 'blob', sha: await blobOf(gh, owner, repo, source) });
        if (from !== null && from !== to) tree.push({ path: from, mode: '100644', type: 'blob', sha: null });
      }
      const newTree = (await gh.rest.git.createTree({ owner, repo, base_tree: baseTree, tree })).data.sha;
      const commit = (await gh.rest.git.createCommit({ owner, repo, message: title, tree: newTree, parents: [baseSha] })).data.sha;
      const made = await gh.rest.git.createRef({ owner, repo, ref: `refs/heads/${head}`, sha: commit }).then(
        () => commit,
        async (err: unknown) => {
          // asked again after a 429 (the action is tried again whole), the branch an earlier try made is there: it is
          // this change when its commit has the same tree on the same base, and the pull request is opened from it
          if ((err as { status?: unknown }).status !== 422) throw err;
          // (only a 404 says there is none: a 429 or a 5xx goes to the provider's retry, as any call's)
          const there = await gh.rest.git
            .getRef({ owner, repo, ref: `heads/${head}` })
            .catch((e: unknown) => ((e as { status?: unknown }).status === 404 ? null : Promise.reject(e)));
          if (!there) throw err;
          const { tree: t, parents } = (await gh.rest.git.getCommit({ owner, repo, commit_sha: there.data.object.sha })).data;
          if (t.sha !== newTree || parents.length !== 1 || parents[0]!.sha !== baseSha)
            throw new ActionArgsError(`the branch ${head} exists already, with other changes: name another args.head`);
          return there.data.object.sha;
        },
      );
      const pr = await gh.rest.pulls.create({ owner, repo, title, head, base, body: optStr(args, 'body') ?? '' });
      return { number: pr.data.number, url: pr.data.html_url, head, base, commit_sha: made, files: tree.length };
    }),
    update_check_run: repeatable(async (a, args) => {
      const gh = await octokitOf(a);
      const res = await gh.rest.checks.update({
        ...repoOf(args),
        check_run_id: int(args, 'check_run_id'),
        ...completion(args),
        ...(checkOutput(args) ? { output: checkOutput(args) } : {}),
      });
      return { check_run_id: res.data.id, url: res.data.html_url };
    }),
  },
  chat: {
    post: once(async (a, args) => {
      const slack = await slackOf(a);
      const res = await slack.chat.postMessage({
        channel: str(args, 'channel'),
        text: str(args, 'text'),
        ...(optStr(args, 'thread_ts') ? { thread_ts: optStr(args, 'thread_ts') } : {}),
      });
      return { channel: res.channel, ts: res.ts, thread_ts: optStr(args, 'thread_ts') ?? null };
    }),
    reply: once(async (a, args) => {
      const slack = await slackOf(a);
      const thread = str(args, 'thread_ts');
      const res = await slack.chat.postMessage({ channel: str(args, 'channel'), text: str(args, 'text'), thread_ts: thread });
      return { channel: res.channel, ts: res.ts, thread_ts: thread };
    }),
  },
  tracker: {
    set_labels: repeatable(async (a, args) => {
      const names = list(args, 'labels', (v, i) => {
        if (typeof v !== 'string' || !v.trim()) throw new ActionArgsError(`args.labels[${i}] must be a label name`);
        return v.trim();
      });
      if (!names.length) throw new ActionArgsError('args.labels must name at least one label');
      const linear = await linearOf(a);
      const issueId = str(args, 'issue_id');
      const found = await linear.issueLabels({ filter: { name: { in: names } }, first: 100 });
      const byName = new Map(found.nodes.map((l) => [l.name.toLowerCase(), l]));
      const known = names.filter((n) => byName.has(n.toLowerCase()));
      const unknown = names.filter((n) => !byName.has(n.toLowerCase()));
      if (!known.length) throw new ActionArgsError(`none of the labels exist in the tracker: ${unknown.join(', ')}`);
      // added to the issue's labels, not in their place
      const res = await linear.updateIssue(issueId, { addedLabelIds: known.map((n) => byName.get(n.toLowerCase())!.id) });
      return { issue_id: issueId, success: res.success, labels: known, unknown_labels: unknown };
    }),
    set_priority: repeatable(async (a, args) => {
      const linear = await linearOf(a);
      const issueId = str(args, 'issue_id');
      const priority = int(args, 'priority', 0, 4);
      const res = await linear.updateIssue(issueId, { priority });
      return { issue_id: issueId, success: res.success, priority };
    }),
    comment: once(async (a, args) => {
      const linear = await linearOf(a);
      const res = await linear.createComment({ issueId: str(args, 'issue_id'), body: str(args, 'body') });
      return { issue_id: str(args, 'issue_id'), success: res.success, comment_id: res.commentId ?? null };
    }),
  },
  pager: {
    add_note: once(async (a, args) => {
      const incident = encodeURIComponent(str(args, 'incident_id'));
      const res = await pagerCall(a, 'POST', `/incidents/${incident}/notes`, { note: { content: str(args, 'content') } });
      return { incident_id: str(args, 'incident_id'), note_id: (res.note as { id?: string } | undefined)?.id ?? null };
    }),
    acknowledge: repeatable(async (a, args) => {
      const id = str(args, 'incident_id');
      const res = await pagerCall(a, 'PUT', `/incidents/${encodeURIComponent(id)}`, { incident: { type: 'incident_reference', status: 'acknowledged' } });
      return { incident_id: id, status: (res.incident as { status?: string } | undefined)?.status ?? 'acknowledged' };
    }),
  },
  email: {
    reply: once(async (a, args) => {
      const to = str(args, 'to');
      // one recipient, written as an address: a reply never fans out to a list someone put in a header
      if (!/^[^<>\s,;"@]+@[^<>\s,;"@]+$/.test(to)) throw new ActionArgsError('args.to must be one email address');
      const mailer = await mailerOf(a);
      try {
        const inReplyTo = optStr(args, 'in_reply_to');
        const subject = str(args, 'subject');
        const info = await untilAborted(
          mailer.sendMail({
            from: a.settings.from,
            to,
            subject: inReplyTo && !/^re:/i.test(subject) ? `Re: ${subject}` : subject,
            text: str(args, 'text'),
            ...(inReplyTo ? { inReplyTo, references: optStr(args, 'references') ?? inReplyTo } : {}),
          }),
          a.signal,
        );
        return { message_id: info.messageId, accepted: info.accepted.map(String), rejected: info.rejected.map(String) };
      } finally {
        mailer.close();
      }
    }),
  },
};
