// API keys through the API (made, listed, revoked, expiring), the bootstrap keys synced with
// SERVICE_API_KEYS at start, and the CLI's keys list and revoke, all against the real store.
import { expect } from 'chai';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { builtCli } from '../support/built.js';
import { spawnAsync } from '../support/spawn.js';
import { KEYS, sameDeployment, startHarness, type Harness } from '../support/harness.js';

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Body = Record<string, any>;

describe('api keys', function () {
  let h: Harness;
  /** a second runtime on the same store and Redis: what another web process sees */
  let other: Harness;
  const shared = () => sameDeployment(h);

  before(async () => {
    h = await startHarness({ workers: false });
    // its streams' heartbeats 30 s apart: what ends a stream sooner is not its heartbeat
    other = await startHarness({ workers: false, env: { ...shared(), SERVICE_SSE_HEARTBEAT_SECONDS: '30' } });
  });
  after(async () => {
    await other?.close();
    await h?.close();
  });

  it('makes a key shown once, lists keys without their hashes, and keeps each tenant to its own', async () => {
    // a label with control characters (an escape sequence that redrew the operator's list) is refused
    const before = (await h.call<Body>('GET', '/api/v1/api-keys')).body.data.length;
    for (const label of ['bot\u001b[2K\u001b[31mrevoked', 'two\nlines', 'del\u007f', 'csi\u009b2K']) {
      const refused = await h.call<Body>('POST', '/api/v1/api-keys', { body: { label } });
      expect(refused.status, JSON.stringify(label)).to.equal(400);
      expect(refused.body.errors[0].path).to.equal('/body/label');
    }
    expect((await h.call<Body>('GET', '/api/v1/api-keys')).body.data.length).to.equal(before);
    const made = await h.call<Body>('POST', '/api/v1/api-keys', { body: { label: 'deploy bot' } });
    expect(made.status, made.text).to.equal(201);
    expect(made.body.key).to.match(/^sk_/);
    expect(made.body.api_key).to.deep.include({ label: 'deploy bot', source: 'api', revoked_at: null, expires_at: null, last_used_at: null });
    expect(made.body.api_key.created_by).to.match(/^key:key_/);
    expect((await h.call('GET', '/api/v1/runs', { key: made.body.key })).status).to.equal(200);
    expect((await other.call('GET', '/api/v1/runs', { key: made.body.key })).status, 'another process takes it').to.equal(200);

    const listed = await h.call<Body>('GET', '/api/v1/api-keys');
    expect(listed.status).to.equal(200);
    expect(listed.text).not.to.contain('hash').and.not.to.contain(made.body.key);
    const mine = listed.body.data.find((k: Body) => k.id === made.body.api_key.id);
    expect(mine.last_used_at, 'its use is recorded').to.be.a('string');
    expect(listed.body.data.map((k: Body) => k.source)).to.include('bootstrap');

    const theirs = await h.call<Body>('GET', '/api/v1/api-keys', { key: KEYS.b });
    expect(theirs.body.data.map((k: Body) => k.id)).not.to.include(made.body.api_key.id);
    expect((await h.call('DELETE', `/api/v1/api-keys/${made.body.api_key.id}`, { key: KEYS.b })).status).to.equal(404);
    expect((await h.call('GET', '/api/v1/runs', { key: made.body.key })).status, 'still works').to.equal(200);
  });

  it('lists keys a page at a time, newest first, and holds a tenant to SERVICE_TENANT_MAX_API_KEYS keys neither revoked nor expired made through the API', async () => {
    const capped = await startHarness({ workers: false, env: { SERVICE_TENANT_MAX_API_KEYS: '3' } });
    try {
      // tenant-a's bootstrap key is the operator's, not counted: three through the API reach 3
      const made: Body[] = [];
      for (const label of ['zero', 'one', 'two']) made.push((await capped.call<Body>('POST', '/api/v1/api-keys', { body: { label } })).body);
      const over = await capped.call<Body>('POST', '/api/v1/api-keys', { body: { label: 'three' } });
      expect(over.status, over.text).to.equal(409);
      expect(over.body.detail).to.contain('SERVICE_TENANT_MAX_API_KEYS');
      // another tenant is not held to it
      expect((await capped.call('POST', '/api/v1/api-keys', { key: KEYS.b, body: { label: 'theirs' } })).status).to.equal(201);
      // a revoked key makes room
      expect((await capped.call('DELETE', `/api/v1/api-keys/${made[1]!.api_key.id}`)).status).to.equal(204);
      expect((await capped.call('POST', '/api/v1/api-keys', { body: { label: 'three' } })).status).to.equal(201);
      // so does one that has expired (tenant B: one of its three expires in a second)
      for (const label of ['b1', 'b2']) expect((await capped.call('POST', '/api/v1/api-keys', { key: KEYS.b, body: { label } })).status).to.equal(201);
      const soon = await capped.call('POST', '/api/v1/api-keys', {
        key: KEYS.b,
        body: { label: 'soon', expires_at: new Date(Date.now() + 1000).toISOString() },
      });
      expect(soon.status, soon.text).to.equal(409);
      expect(
        (
          await capped.call(
            'DELETE',
            `/api/v1/api-keys/${(await capped.call<Body>('GET', '/api/v1/api-keys', { key: KEYS.b })).body.data.find((k: Body) => k.label === 'b2').id}`,
            { key: KEYS.b },
          )
        ).status,
      ).to.equal(204);
      expect(
        (await capped.call('POST', '/api/v1/api-keys', { key: KEYS.b, body: { label: 'soon', expires_at: new Date(Date.now() + 1000).toISOString() } })).status,
      ).to.equal(201);
      expect((await capped.call('POST', '/api/v1/api-keys', { key: KEYS.b, body: { label: 'b3' } })).status).to.equal(409);
      await new Promise((r) => setTimeout(r, 1100));
      expect((await capped.call('POST', '/api/v1/api-keys', { key: KEYS.b, body: { label: 'b3' } })).status, 'once one has expired').to.equal(201);
      const first = await capped.call<Body>('GET', '/api/v1/api-keys?limit=2');
      expect(first.body.data.map((k: Body) => k.label)).to.deep.equal(['three', 'two']);
      const rest = await capped.call<Body>('GET', `/api/v1/api-keys?limit=2&cursor=${first.body.next_cursor}`);
      expect(rest.body.data.map((k: Body) => k.label)).to.deep.equal(['one', 'zero']);
      const last = await capped.call<Body>('GET', `/api/v1/api-keys?limit=2&cursor=${rest.body.next_cursor}`);
      expect(last.body.data.map((k: Body) => k.source)).to.deep.equal(['bootstrap']);
      expect(last.body.next_cursor).to.equal(null);
      expect((await capped.call('GET', '/api/v1/api-keys?limit=0')).status).to.equal(400);
    } finally {
      await capped.close();
    }
  });

  it('refuses a revoked key from the next request, in every process, and keeps it listed as revoked', async () => {
    const made = (await h.call<Body>('POST', '/api/v1/api-keys', { body: { label: 'short-lived' } })).body;
    expect((await other.call('GET', '/api/v1/runs', { key: made.key })).status).to.equal(200);
    expect((await h.call('DELETE', `/api/v1/api-keys/${made.api_key.id}`)).status).to.equal(204);
    const refused = await other.call<Body>('GET', '/api/v1/runs', { key: made.key });
    expect(refused.status).to.equal(401);
    expect(refused.body.detail).to.contain('revoked');
    expect((await h.call('GET', '/api/v1/runs', { key: made.key })).status).to.equal(401);
    const listed = (await h.call<Body>('GET', '/api/v1/api-keys')).body.data.find((k: Body) => k.id === made.api_key.id);
    expect(listed).to.deep.include({ revoked_reason: 'revoked' });
    expect((await h.call('DELETE', `/api/v1/api-keys/${made.api_key.id}`)).status, 'again: nothing changes').to.equal(204);
    expect(h.logs.join('\n')).not.to.contain(made.key);
  });

  it('revokes the keys made with a key only when asked (cascade=true), all the way down and no further', async () => {
    const make = async (key: string, label: string) => (await h.call<Body>('POST', '/api/v1/api-keys', { key, body: { label } })).body;
    const parent = await make(KEYS.a, 'parent');
    const child = await make(parent.key, 'child');
    const grandchild = await make(child.key, 'grandchild');
    const sibling = await make(KEYS.a, 'sibling');
    expect(child.api_key.created_by).to.equal(`key:${parent.api_key.id}`);
    const works = async (k: Body) => (await other.call('GET', '/api/v1/runs', { key: k.key })).status === 200;
    // by default a key's revocation leaves the keys made with it (a rotated admin key must not end the CI keys it made)
    expect((await h.call('DELETE', `/api/v1/api-keys/${parent.api_key.id}`)).status).to.equal(204);
    expect([await works(parent), await works(child), await works(grandchild)]).to.deep.equal([false, true, true]);
    // cascade: the rest of the line goes too, in every process; a key made elsewhere does not
    expect((await h.call('DELETE', `/api/v1/api-keys/${parent.api_key.id}?cascade=true`)).status).to.equal(204);
    expect([await works(child), await works(grandchild), await works(sibling)]).to.deep.equal([false, false, true]);
    const listed = (await h.call<Body>('GET', '/api/v1/api-keys')).body.data as Body[];
    expect(listed.find((k) => k.id === grandchild.api_key.id)).to.deep.include({ revoked_reason: 'revoked' });
    expect((await h.call('DELETE', `/api/v1/api-keys/${sibling.api_key.id}?cascade=maybe`)).status, 'a cascade that is not a boolean').to.equal(400);
    expect(await works(sibling)).to.equal(true);
  });

  it('walks a cascade in time in line with the keys: thousands of revoked keys below a leaked one do not hold the process', async () => {
    const leaked = (await h.call<Body>('POST', '/api/v1/api-keys', { body: { label: 'leaked, with a long past' } })).body;
    // what a leaked key's holder leaves, capped only in live keys: key after key made, each revoked (rows kept),
    // here a tree 6,000 deep and wide, with three live keys at the bottom of its longest branch
    const at = new Date().toISOString();
    const row = (i: number, maker: string) => ({
      id: `key_cascade${String(i).padStart(6, '0')}`,
      tenant_id: 'tenant-a',
      hash: `cascade-${i}-${leaked.api_key.id}`,
      label: null,
      source: 'api' as const,
      created_at: at,
      expires_at: null,
      revoked_at: null,
      revoked_reason: null,
      last_used_at: null,
      created_by: `key:${maker}`,
    });
    const ids: string[] = [];
    for (let i = 0; i < 6000; i++) {
      const maker = i < 100 ? leaked.api_key.id : ids[i % 100 === 0 ? i - 1 : i - (i % 100)]!;
      ids.push(row(i, maker).id);
      expect(await h.rt.store.apiKeys.insert(row(i, maker))).to.equal(true);
    }
    // revoked after they made the keys below them (a key made with a revoked key is refused as it is written)
    await Promise.all(ids.slice(0, -3).map((id) => h.rt.store.apiKeys.update('tenant-a', id, { revoked_at: at, revoked_reason: 'revoked' })));
    const stalls = monitorEventLoopDelay({ resolution: 10 });
    stalls.enable();
    const revoked = await h.call('DELETE', `/api/v1/api-keys/${leaked.api_key.id}?cascade=true`);
    stalls.disable();
    expect(revoked.status).to.equal(204);
    const left = (await h.rt.store.apiKeys.list('tenant-a')).filter((k) => k.id.startsWith('key_cascade') && !k.revoked_at);
    expect(left.map((k) => k.id)).to.deep.equal([]);
    // a walk reading every key for each key it reached held the loop about a second at 6,000 keys (9 s at 20,000)
    expect(stalls.max / 1e6, 'the longest stall of the event loop, ms').to.be.below(400);
  });

  it('deletes keys revoked or expired more than SERVICE_API_KEYS_SPENT_KEPT_DAYS ago (90), and keeps the rest', async () => {
    const ago = (days: number) => new Date(Date.now() - days * 86_400_000).toISOString();
    const row = (label: string, o: { revoked_at?: string; expires_at?: string }) => ({
      id: `key_spent${label}${Date.now()}`,
      tenant_id: 'tenant-a',
      hash: `spent-${label}-${Date.now()}`,
      label,
      source: 'api' as const,
      created_at: ago(400),
      expires_at: o.expires_at ?? null,
      revoked_at: o.revoked_at ?? null,
      revoked_reason: o.revoked_at ? ('revoked' as const) : null,
      last_used_at: null,
      created_by: null,
    });
    const old = [row('revoked100', { revoked_at: ago(100) }), row('expired91', { expires_at: ago(91) })];
    const kept = [row('revoked80', { revoked_at: ago(80) }), row('expires', { expires_at: ago(-10) })];
    for (const k of [...old, ...kept]) expect(await h.rt.store.apiKeys.insert(k)).to.equal(true);
    expect(await h.rt.engine.apiKeys.prune()).to.be.at.least(2);
    const listed = (await h.rt.store.apiKeys.list('tenant-a')).map((k) => k.label);
    expect(listed).to.include.members(['revoked80', 'expires']);
    for (const gone of ['revoked100', 'expired91']) expect(listed).to.not.include(gone);
  });

  it('leaves no key made with a revoked key: a request let in before a cascade makes none after it, however many race it', async () => {
    const works = async (key: string) => (await other.call('GET', '/api/v1/runs', { key })).status === 200;
    const leaked = (await h.call<Body>('POST', '/api/v1/api-keys', { body: { label: 'leaked' } })).body;
    // the holder's requests in flight as the cascade runs: each was let in with the key, and writes after
    const made = Promise.all(Array.from({ length: 30 }, (_, i) => h.call<Body>('POST', '/api/v1/api-keys', { key: leaked.key, body: { label: `held-${i}` } })));
    await new Promise((r) => setTimeout(r, 2));
    expect((await h.call('DELETE', `/api/v1/api-keys/${leaked.api_key.id}?cascade=true`)).status).to.equal(204);
    const answers = await made;
    for (const a of answers) expect([201, 401], a.text).to.include(a.status);
    for (const a of answers.filter((x) => x.status === 201)) expect(await works(a.body.key), a.body.api_key.label).to.equal(false);
    // a request whose key was revoked as it was let in: refused when its key is written, nothing made
    const late = (await h.call<Body>('POST', '/api/v1/api-keys', { body: { label: 'late' } })).body;
    await h.call('DELETE', `/api/v1/api-keys/${late.api_key.id}`);
    const before = (await h.call<Body>('GET', '/api/v1/api-keys')).body.data.length;
    const err = await h.rt.engine.apiKeys.create('tenant-a', { source: 'api', label: 'after', created_by: `key:${late.api_key.id}` }).then(
      () => null,
      (e: Error & { code?: string }) => e,
    );
    expect(err?.code).to.equal('unauthorized');
    expect((await h.call<Body>('GET', '/api/v1/api-keys')).body.data.length).to.equal(before);
  });

  it('ends an open event stream once its key is revoked, in another process, before anything more reaches it', async () => {
    const made = (await h.call<Body>('POST', '/api/v1/api-keys', { body: { label: 'watcher' } })).body;
    const session = (await h.call<Body>('POST', '/api/v1/sessions', { body: { title: 'watched' } })).body;
    const say = (text: string) => h.call('POST', `/api/v1/sessions/${session.id}/messages`, { body: { role: 'user', parts: [{ type: 'text', text }] } });
    // the stream is served by the other process, whose heartbeat is 30 s apart: the revocation reaches it through
    // the store alone, and the key is checked again each second, not each heartbeat
    const res = await fetch(`${other.url}/api/v1/sessions/${session.id}/trace`, { headers: { authorization: `Bearer ${made.key}` } });
    expect(res.status).to.equal(200);
    const reader = res.body!.getReader();
    let text = '';
    const ended = (async () => {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return true;
        text += Buffer.from(value).toString();
      }
    })();
    await say('before-revocation');
    const deadline = Date.now() + 5000;
    while (!text.includes('before-revocation') && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    expect(text).to.contain('before-revocation');
    expect((await h.call('DELETE', `/api/v1/api-keys/${made.api_key.id}`)).status).to.equal(204);
    // the stream ends within a second or so, and what is posted after it never reaches it
    const closed = await Promise.race([ended, new Promise((r) => setTimeout(() => r(false), 4000))]);
    expect(closed, 'the stream ended').to.equal(true);
    await say('after-revocation');
    await new Promise((r) => setTimeout(r, 200));
    expect(text).not.to.contain('after-revocation');
    const again = await fetch(`${other.url}/api/v1/sessions/${session.id}/trace`, { headers: { authorization: `Bearer ${made.key}` } });
    expect(again.status, 'the reconnect is refused').to.equal(401);
  });

  it('takes an expiry in the future only, and refuses the key once it has passed', async () => {
    const past = await h.call<Body>('POST', '/api/v1/api-keys', { body: { expires_at: '2020-01-01T00:00:00Z' } });
    expect(past.status, past.text).to.equal(400);
    const bad = await h.call<Body>('POST', '/api/v1/api-keys', { body: { expires_at: 'tomorrow' } });
    expect(bad.status, bad.text).to.equal(400);
    // a leap second passes the format and is no instant: refused, never a key that cannot expire
    const leap = await h.call<Body>('POST', '/api/v1/api-keys', { body: { expires_at: '2030-12-31T23:59:60Z' } });
    expect(leap.status, leap.text).to.equal(400);
    // a day its month does not have is no date (Date.parse would roll it into the next month, a key living two days longer)
    for (const expires_at of ['2030-02-30T00:00:00Z', '2030-04-31T12:00:00Z']) {
      const rolled = await h.call<Body>('POST', '/api/v1/api-keys', { body: { expires_at } });
      expect(rolled.status, `${expires_at}: ${rolled.text}`).to.equal(400);
      expect(rolled.body.errors[0].path).to.equal('/body/expires_at');
    }
    const soon = (await h.call<Body>('POST', '/api/v1/api-keys', { body: { expires_at: new Date(Date.now() + 1500).toISOString() } })).body;
    expect((await h.call('GET', '/api/v1/runs', { key: soon.key })).status).to.equal(200);
    // a key that expires makes keys that expire with it, never later
    const child = await h.call<Body>('POST', '/api/v1/api-keys', { key: soon.key, body: { label: 'child' } });
    expect(child.status, child.text).to.equal(201);
    expect(child.body.api_key.expires_at).to.equal(soon.api_key.expires_at);
    const later = await h.call<Body>('POST', '/api/v1/api-keys', { key: soon.key, body: { expires_at: new Date(Date.now() + 86_400_000).toISOString() } });
    expect(later.status, later.text).to.equal(400);
    expect(later.body.errors[0]).to.deep.include({ path: '/body/expires_at' });
    await new Promise((r) => setTimeout(r, 1600));
    expect((await h.call('GET', '/api/v1/runs', { key: soon.key })).status).to.equal(401);
    expect((await h.call('GET', '/api/v1/runs', { key: child.body.key })).status, 'the child expired with it').to.equal(401);
  });

  it('revokes at start the bootstrap keys that left SERVICE_API_KEYS and restores one listed again; a revocation here stays', async () => {
    const C = 'key-tenant-c-0123456789abcdef';
    const all = `tenant-a:${KEYS.a},tenant-b:${KEYS.b},tenant-c:${C}`;
    const withC = await startHarness({ workers: false, env: { ...shared(), SERVICE_API_KEYS: all } });
    await withC.close();
    const onlyA = await startHarness({ workers: false, env: { ...shared(), SERVICE_API_KEYS: `tenant-a:${KEYS.a}` } });
    try {
      expect((await onlyA.call('GET', '/api/v1/runs', { key: KEYS.b })).status, 'a key that left the variable').to.equal(401);
      expect((await h.call('GET', '/api/v1/runs', { key: KEYS.b })).status, 'in every process').to.equal(401);
      // tenant-c's key, dropped from the variable, is also revoked on purpose (leaked, say)
      const c = (await onlyA.rt.engine.apiKeys.list('tenant-c')).find((k) => k.source === 'bootstrap')!;
      expect(c.revoked_reason).to.equal('removed from SERVICE_API_KEYS');
      expect((await onlyA.rt.engine.apiKeys.revoke('tenant-c', c.id)).key.revoked_reason).to.equal('revoked');
    } finally {
      await onlyA.close();
    }
    // an old release starts with the old variable: b comes back, c does not
    const old = await startHarness({ workers: false, env: { ...shared(), SERVICE_API_KEYS: all } });
    try {
      expect((await old.call('GET', '/api/v1/runs', { key: KEYS.b })).status, 'listed again').to.equal(200);
      expect((await old.call('GET', '/api/v1/runs', { key: C })).status, 'revoked on purpose, it stays revoked').to.equal(401);
      const bootstrapB = (await old.call<Body>('GET', '/api/v1/api-keys', { key: KEYS.b })).body.data.find((k: Body) => k.source === 'bootstrap');
      expect((await old.call('DELETE', `/api/v1/api-keys/${bootstrapB.id}`, { key: KEYS.b })).status).to.equal(204);
    } finally {
      await old.close();
    }
    const again = await startHarness({ workers: false, env: shared() });
    try {
      expect((await again.call('GET', '/api/v1/runs', { key: KEYS.b })).status, 'revoked through the API, it stays revoked').to.equal(401);
    } finally {
      await again.close();
    }
  });

  it('lists and revokes keys from the command line, on the service’s store', async function () {
    // nine CLI processes, each loading the service's modules: 7 s alone, over 30 s twice beside the other
    // time-bound files on a slower machine (each start is bound by the CPU they share)
    this.timeout(120_000);
    const CLI = builtCli();
    const env = { ...process.env, SERVICE_DATA_DIR: h.config.dataDir, SERVICE_AUTH: '', NO_COLOR: '1' };
    const made = (await h.call<Body>('POST', '/api/v1/api-keys', { body: { label: 'from the cli test' } })).body;
    const list = await spawnAsync(process.execPath, [CLI, 'keys', 'list', '--tenant', 'tenant-a'], { env });
    expect(list.status, list.stderr).to.equal(0);
    expect(list.stdout).to.contain(made.api_key.id).and.contain('from the cli test').and.contain('active');
    expect(list.stdout).not.to.contain(made.key);
    const revoke = await spawnAsync(process.execPath, [CLI, 'keys', 'revoke', made.api_key.id, '--tenant', 'tenant-a'], { env });
    expect(revoke.status, revoke.stderr).to.equal(0);
    expect((await h.call('GET', '/api/v1/runs', { key: made.key })).status).to.equal(401);
    const json = await spawnAsync(process.execPath, [CLI, 'keys', 'list', '--tenant', 'tenant-a', '--json'], { env });
    const parsed = JSON.parse(json.stdout) as Body[];
    expect(parsed.find((k) => k.id === made.api_key.id)).to.deep.include({ revoked_reason: 'revoked' });
    expect(json.stdout).not.to.contain('"hash"');
    // the caller's mistakes exit 2 (usage), not 5 (the service away), which CI scripts retry
    for (const args of [
      ['keys', 'revoke', 'key_01doesnotexist0000000000000', '--tenant', 'tenant-a'],
      ['keys', 'revoke', made.api_key.id, '--tenant', 'tenant-b'],
      ['keys', 'create', '--tenant', 'tenant-a', '--expires', '2020-01-01T00:00:00Z'],
      // a day its month does not have, and what Date.parse would take for a date
      ['keys', 'create', '--tenant', 'tenant-a', '--expires', '2030-02-30T00:00:00Z'],
      ['keys', 'create', '--tenant', 'tenant-a', '--expires', 'March 7'],
    ]) {
      const refused = await spawnAsync(process.execPath, [CLI, ...args], { env });
      expect(refused.status, `${args.join(' ')}: ${refused.stderr}`).to.equal(2);
    }
    const ok = await spawnAsync(process.execPath, [CLI, 'keys', 'create', '--tenant', 'tenant-a', '--expires', '2030-02-28T12:00:00+01:00'], { env });
    expect(ok.status, ok.stderr).to.equal(0);
  });
});

describe('api rate limits', function () {
  let h: Harness;
  let other: Harness;

  before(async () => {
    const limits = { SERVICE_API_RATE_LIMIT_PER_MINUTE: '5', SERVICE_API_KEY_RATE_LIMIT_PER_MINUTE: '3' };
    h = await startHarness({ workers: false, env: limits });
    other = await startHarness({
      workers: false,
      env: { ...limits, SERVICE_DATA_DIR: h.config.dataDir, SERVICE_WORKSPACE_ROOT: h.workspace, SERVICE_QUEUE_PREFIX: h.config.queuePrefix },
    });
  });
  after(async () => {
    await other?.close();
    await h?.close();
  });

  it('counts requests per key and per tenant across processes, with the draft headers and Retry-After on 429', async () => {
    const second = await h.rt.engine.apiKeys.create('tenant-a', { source: 'cli' });
    const first = await h.call<Body>('GET', '/api/v1/runs');
    expect(first.status).to.equal(200);
    expect(first.headers.get('ratelimit-policy')).to.equal('"tenant";q=5;w=60, "key";q=3;w=60');
    expect(first.headers.get('ratelimit')).to.match(/^"key";r=2;t=\d+$/);
    expect((await other.call('GET', '/api/v1/runs')).headers.get('ratelimit')).to.match(/^"key";r=1;t=/);
    expect((await h.call('GET', '/api/v1/runs')).status).to.equal(200);
    const spentKey = await other.call<Body>('GET', '/api/v1/runs');
    expect(spentKey.status, 'the key is spent, in the other process too').to.equal(429);
    expect(spentKey.body.code).to.equal('rate-limited');
    expect(Number(spentKey.headers.get('retry-after'))).to.be.within(1, 60);
    expect(spentKey.headers.get('ratelimit')).to.match(/^"key";r=0;t=\d+$/);

    // a key retrying after its 429s spends nothing more, of its own budget or its tenant's
    for (let i = 0; i < 5; i++) expect((await h.call('GET', '/api/v1/runs')).status).to.equal(429);
    // the tenant's budget is shared by its keys: 3 counted so far (the refused requests did not count)
    const viaSecond = await h.call<Body>('GET', '/api/v1/runs', { key: second.key });
    expect(viaSecond.status).to.equal(200);
    expect(viaSecond.headers.get('ratelimit')).to.match(/^"tenant";r=1;t=/);
    expect((await h.call<Body>('GET', '/api/v1/runs', { key: second.key })).headers.get('ratelimit')).to.match(/^"tenant";r=0;t=/);
    const spentTenant = await h.call<Body>('GET', '/api/v1/runs', { key: second.key });
    expect(spentTenant.status).to.equal(429);
    expect(spentTenant.headers.get('ratelimit')).to.match(/^"tenant";r=0;/);
    expect(spentTenant.body.detail).to.contain("tenant's 5 requests a minute");

    expect((await h.call('GET', '/api/v1/runs', { key: KEYS.b })).status, 'another tenant is not touched').to.equal(200);
  });
});
