// Where an audit may look: real paths, directories only; /etc, /proc and /sys refused however they are
// named (.., a link, /proc/self/root, a bind mount) unless the operator allows them; in production only
// the tenant's root and the allowed roots.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { resolveAuditRoot, type AuditRootPolicy } from '../../engine/audit/index.js';
import { PathNotPermittedError, ValidationError } from '../../engine/platform/index.js';

describe('audit roots', () => {
  let dir: string;
  let tenantRoot: string;
  let policy: AuditRootPolicy;
  before(async () => {
    dir = await fs.realpath(await fs.mkdtemp(path.join(os.tmpdir(), 'audit-roots-')));
    tenantRoot = path.join(dir, 'tenant');
    await fs.mkdir(path.join(tenantRoot, 'app'), { recursive: true });
    policy = { tenantRoot, isProduction: false, allowSensitive: false, allowedRoots: [] };
  });
  after(async () => {
    await fs.rm(dir, { recursive: true, force: true });
  });

  const refused = async (requested: string, p = policy) => {
    const err = await resolveAuditRoot(requested, p).then(
      () => null,
      (e: unknown) => e,
    );
    return err;
  };

  it('never reads another tenant’s root or the service’s data folder, in any environment', async () => {
    const workspaces = path.join(dir, 'workspaces');
    const own = path.join(workspaces, 'tenant-a');
    const data = path.join(dir, 'data');
    for (const d of [path.join(own, 'app'), path.join(workspaces, 'tenant-b', 'app'), path.join(data, 'redis')]) await fs.mkdir(d, { recursive: true });
    await fs.symlink(path.join(workspaces, 'tenant-b'), path.join(own, 'to-b'));
    for (const isProduction of [false, true]) {
      const p: AuditRootPolicy = { ...policy, tenantRoot: own, isProduction, privateRoots: { workspaceRoot: workspaces, dataDir: data } };
      expect(await resolveAuditRoot('app', p)).to.equal(path.join(own, 'app'));
      for (const requested of ['../tenant-b', '../tenant-b/app', 'to-b', workspaces, data, path.join(data, 'redis'), '../../data', '../..', dir])
        expect(await refused(requested, p), `${requested}, production ${isProduction}`).to.be.instanceOf(PathNotPermittedError);
      // the same answer whether what is named there exists or not: nothing of another tenant's shows
      for (const requested of ['../tenant-b/missing', '../tenant-zz', 'to-b/missing', path.join(data, 'missing')])
        expect(await refused(requested, p), `${requested}, production ${isProduction}`).to.be.instanceOf(PathNotPermittedError);
    }
    // the workspaces inside the data folder (as SERVICE_DATA_DIR/workspaces): the tenant's own root and its
    // folders are its to audit; the data folder's other folders, the workspaces and other roots are not
    const inData = path.join(data, 'workspaces');
    const mine = path.join(inData, 'tenant-a');
    for (const d of [path.join(mine, 'app'), path.join(inData, 'tenant-b')]) await fs.mkdir(d, { recursive: true });
    for (const isProduction of [false, true]) {
      const p: AuditRootPolicy = { ...policy, tenantRoot: mine, isProduction, privateRoots: { workspaceRoot: inData, dataDir: data } };
      expect(await resolveAuditRoot(undefined, p), `production ${isProduction}`).to.equal(mine);
      expect(await resolveAuditRoot('.', p)).to.equal(mine);
      expect(await resolveAuditRoot('app', p)).to.equal(path.join(mine, 'app'));
      for (const requested of ['../tenant-b', '..', '../../redis', '../..'])
        expect(await refused(requested, p), `${requested}, production ${isProduction}`).to.be.instanceOf(PathNotPermittedError);
    }
    // outside production a folder elsewhere is still the developer's to audit
    const dev: AuditRootPolicy = { ...policy, tenantRoot: own, privateRoots: { workspaceRoot: workspaces, dataDir: data } };
    expect(await resolveAuditRoot(path.join(dir, 'tenant'), dev)).to.equal(path.join(dir, 'tenant'));
  });

  it('resolves the tenant root, a folder of it, or any readable directory outside production', async () => {
    expect(await resolveAuditRoot(undefined, policy)).to.equal(tenantRoot);
    expect(await resolveAuditRoot('app', policy)).to.equal(path.join(tenantRoot, 'app'));
    expect(await resolveAuditRoot(dir, policy)).to.equal(dir);
    expect(await refused('missing')).to.be.instanceOf(ValidationError);
    await fs.writeFile(path.join(tenantRoot, 'file.txt'), 'x');
    expect(await refused('file.txt')).to.be.instanceOf(ValidationError);
  });

  it('refuses /etc, /proc and /sys by name, through .., through a link and through /proc/self/root, unless allowed', async () => {
    await fs.symlink('/etc', path.join(tenantRoot, 'etc-link'));
    for (const requested of ['/etc', '/etc/ssl', '../../../../../../etc', 'etc-link', '/proc/self/root/etc', '/proc', '/proc/self', '/sys/kernel'])
      expect(await refused(requested), requested).to.be.instanceOf(PathNotPermittedError);
    expect(await resolveAuditRoot('etc-link', { ...policy, allowSensitive: true })).to.equal('/etc');
  });

  it('refuses a path through /proc that leads elsewhere: /proc/self/cwd (the service’s own folder), and a link to it', async () => {
    await fs.symlink('/proc/self/cwd', path.join(tenantRoot, 'cwd-link'));
    await fs.symlink(`/proc/${process.pid}/root/tmp`, path.join(tenantRoot, 'tmp-link'));
    for (const requested of ['/proc/self/cwd', '/proc/../proc/self/cwd', `/proc/${process.pid}/cwd`, 'cwd-link', 'tmp-link']) {
      const err = await refused(requested);
      expect(err, requested).to.be.instanceOf(PathNotPermittedError);
      expect((err as Error).message, requested).to.match(/reached through \/proc/);
    }
    // the same folders named as they are
    expect(await resolveAuditRoot(process.cwd(), policy)).to.equal(await fs.realpath(process.cwd()));
    expect(await resolveAuditRoot('cwd-link', { ...policy, allowSensitive: true })).to.equal(await fs.realpath(process.cwd()));
  });

  it('refuses a bind mount of /etc elsewhere (same device and inode)', async function () {
    const mounted = path.join(dir, 'bind');
    await fs.mkdir(mounted);
    try {
      execFileSync('mount', ['--bind', '/etc', mounted], { stdio: 'ignore' });
    } catch {
      console.log('      skipped: this machine cannot bind-mount (needs root and CAP_SYS_ADMIN)');
      this.skip();
    }
    try {
      expect(await fs.realpath(mounted)).to.equal(mounted); // the name says nothing of /etc
      const err = await refused(mounted);
      expect(err).to.be.instanceOf(PathNotPermittedError);
      expect((err as Error).message).to.contain('the same folder as /etc');
      expect(await refused(path.join(mounted, 'ssl'))).to.be.instanceOf(PathNotPermittedError);
    } finally {
      execFileSync('umount', [mounted], { stdio: 'ignore' });
    }
  });

  it('in production, audits only the tenant root and the allowed roots', async () => {
    const prod = { ...policy, isProduction: true, allowedRoots: [path.join(dir, 'shared')] };
    await fs.mkdir(path.join(dir, 'shared', 'repo'), { recursive: true });
    await fs.mkdir(path.join(dir, 'elsewhere'));
    expect(await resolveAuditRoot('app', prod)).to.equal(path.join(tenantRoot, 'app'));
    expect(await resolveAuditRoot(path.join(dir, 'shared', 'repo'), prod)).to.equal(path.join(dir, 'shared', 'repo'));
    expect(await refused(path.join(dir, 'elsewhere'), prod)).to.be.instanceOf(PathNotPermittedError);
    expect(await refused('..', prod)).to.be.instanceOf(PathNotPermittedError);
    // what is outside is refused alike whether it exists or not: no answer tells what exists elsewhere
    const there = (await refused(path.join(dir, 'elsewhere'), prod)) as Error;
    const absent = (await refused(path.join(dir, 'elsewhere', 'nothing'), prod)) as Error;
    expect(absent).to.be.instanceOf(PathNotPermittedError);
    expect(absent.message.replace('/nothing', '')).to.equal(there.message);
  });
});
