// Where an audit may look: the folder of the X-Service-Workspace-Root header (or the tenant's root),
// resolved to its real path and a directory. /etc, /proc and /sys are refused (403) unless the
// operator allows them (SERVICE_AUDIT_ALLOW_SENSITIVE_PATHS=1), and not only by name: a folder whose
// real path is under one, whose device and inode are one of theirs or one of their subfolders' (a
// bind mount of /etc elsewhere), or whose file system is procfs or sysfs is refused as well. Outside
// production any readable directory may be audited (the folder open in a developer's editor) but
// another tenant's root and the service's data folder; in production only the tenant's root and the
// roots the operator names (SERVICE_AUDIT_ALLOWED_ROOTS).
import { constants } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { PathNotPermittedError, ValidationError, whereLeads } from '../platform/index.js';

export type AuditRootPolicy = {
  /** the tenant's workspace root (relative requests are resolved from it) */
  tenantRoot: string;
  isProduction: boolean;
  allowSensitive: boolean;
  /** production: roots besides the tenant's that may be audited */
  allowedRoots: string[];
  /** the folders refused unless allowed (the default: /etc, /proc, /sys) */
  sensitiveRoots?: string[];
  /**
   * What no audit reads into, in any environment: the tenants' workspace root outside this tenant's own
   * (another tenant's folders) and the service's data folder (its keys, its store)
   */
  privateRoots?: { workspaceRoot: string; dataDir: string };
};

const SENSITIVE_ROOTS = ['/etc', '/proc', '/sys'];
const PROC_SUPER_MAGIC = 0x9fa0;
const SYSFS_MAGIC = 0x62656572;
/** how deep below a sensitive root its folders' identities are compared (a bind mount of /etc/ssl, say) */
const IDENTITY_DEPTH = 2;

const inside = (dir: string, root: string) => dir === root || dir.startsWith(root.endsWith(path.sep) ? root : root + path.sep);

/** The identities (device and inode) of the sensitive roots and of their folders a little below. */
async function identities(roots: string[]): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  const walk = async (dir: string, depth: number) => {
    const stat = await fs.stat(dir).catch(() => null);
    if (!stat?.isDirectory()) return;
    out.set(`${stat.dev}:${stat.ino}`, dir);
    if (depth >= IDENTITY_DEPTH) return;
    const entries = await fs.readdir(dir, { withFileTypes: true }).catch(() => []);
    await Promise.all(entries.filter((e) => e.isDirectory() && !e.isSymbolicLink()).map((e) => walk(path.join(dir, e.name), depth + 1)));
  };
  // /proc and /sys are told by their file system type; walking them would be slow and pointless
  await Promise.all(roots.map((r) => walk(r, r === '/proc' || r === '/sys' ? IDENTITY_DEPTH : 0)));
  return out;
}

let known: { roots: string; ids: Promise<Map<string, string>> } | undefined;

/** Refuses (403) a folder that is, holds or is inside what no audit reads: the data folder, another tenant's root. */
async function assertNotPrivate(real: string, requested: string | undefined, policy: AuditRootPolicy): Promise<void> {
  const [workspaces, data, own] = await Promise.all(
    [policy.privateRoots!.workspaceRoot, policy.privateRoots!.dataDir, policy.tenantRoot].map((r) => fs.realpath(r).catch(() => path.resolve(r))),
  );
  const named = requested ?? real;
  // in the folder or above it: a folder that holds the data folder or other tenants' roots reads them too. A
  // folder inside the data folder is refused too, but for the workspaces (SERVICE_WORKSPACE_ROOT may be
  // inside SERVICE_DATA_DIR), whose own rule follows
  if (inside(data!, real) || (inside(real, data!) && !inside(real, workspaces!)))
    throw new PathNotPermittedError(`${named} is, holds or is inside the service's data folder, which no audit reads`);
  if (!inside(real, own!) && (inside(real, workspaces!) || (workspaces !== own && inside(workspaces!, real))))
    throw new PathNotPermittedError(`${named} is or holds another tenant's workspace root`);
}

/** Resolves and checks an audit's root; throws a 400 for what is not a readable directory, a 403 for what is not permitted. */
export async function resolveAuditRoot(requested: string | undefined, policy: AuditRootPolicy): Promise<string> {
  const sensitive = policy.sensitiveRoots ?? SENSITIVE_ROOTS;
  const wanted = requested === undefined || requested === '' ? policy.tenantRoot : path.resolve(policy.tenantRoot, requested);
  // in production a folder outside what is allowed is refused whether it exists or not, with one answer:
  // a 400 for a missing folder and a 403 for an existing one would tell a tenant what exists elsewhere
  const outside = () =>
    new PathNotPermittedError(`${requested ?? 'the folder'} is not a readable folder inside the tenant's workspace root or SERVICE_AUDIT_ALLOWED_ROOTS`);
  const notAFolder = () =>
    policy.isProduction
      ? outside()
      : new ValidationError(`${requested ?? '(the tenant root)'} is not a readable directory`, [
          { path: '/headers/x-service-workspace-root', message: 'must be a readable directory' },
        ]);
  // what no audit reads (another tenant's root, the data folder) is refused whether it exists or not, before
  // anything else: a 400 for a missing folder there and a 403 for one that exists told a tenant another's folders
  const passed: string[] = [];
  const leads = await whereLeads(wanted, (at) => passed.push(at));
  if (policy.privateRoots) await assertNotPrivate(leads, requested, policy);
  const real = await fs.realpath(wanted).catch(() => null);
  const stat = real ? await fs.stat(real).catch(() => null) : null;
  if (!real || !stat?.isDirectory()) throw notAFolder();
  if (
    !(await fs.access(real, constants.R_OK).then(
      () => true,
      () => false,
    ))
  )
    throw notAFolder();

  if (!policy.allowSensitive) {
    const refuse = (why: string) =>
      new PathNotPermittedError(`${requested ?? real} is ${why}; audits of /etc, /proc and /sys need SERVICE_AUDIT_ALLOW_SENSITIVE_PATHS=1`);
    const realSensitive = await Promise.all(sensitive.map((r) => fs.realpath(r).catch(() => r)));
    if (realSensitive.some((r) => inside(real, r))) throw refuse(`under ${realSensitive.find((r) => inside(real, r))}`);
    // a path through one that leads elsewhere (/proc/self/cwd, the service's own folder; a link to it)
    const through = passed.find((at) => realSensitive.some((r) => inside(at, r)));
    if (through) throw refuse(`reached through ${through}`);
    const fsType = (await fs.statfs(real).catch(() => null))?.type;
    if (fsType === PROC_SUPER_MAGIC || fsType === SYSFS_MAGIC) throw refuse('on the proc or sys file system');
    const key = realSensitive.join('\0');
    if (known?.roots !== key) known = { roots: key, ids: identities(realSensitive) };
    const ids = await known.ids;
    // the folder and every folder above it: one that is a sensitive folder seen through another path
    for (let dir = real; ; dir = path.dirname(dir)) {
      const s = await fs.stat(dir).catch(() => null);
      const same = s ? ids.get(`${s.dev}:${s.ino}`) : undefined;
      if (same) throw refuse(`the same folder as ${same}`);
      if (dir === path.dirname(dir)) break;
    }
  }

  if (policy.privateRoots) await assertNotPrivate(real, requested, policy);

  if (policy.isProduction) {
    const allowed = await Promise.all([policy.tenantRoot, ...policy.allowedRoots].map((r) => fs.realpath(r).catch(() => null)));
    if (!allowed.some((r) => r && inside(real, r))) throw outside();
  }
  return real;
}
